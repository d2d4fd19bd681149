"""Floodgate's Lua scripts, one per file (verb_noun.lua), shipped as package data; a chunk two
scripts share (a noun.lua) is included where a script says `--#include <noun>`.

webhooks/storage/live/redis.py registers each once per client with redis-py's `register_script`,
whose Script object calls EVALSHA and falls back to EVAL by itself after a Redis restart has
emptied the script cache (the way alisaifee/limits loads its scripts); a batch of calls
(webhooks/storage/live/batch.py) sends their text with EVAL.
"""

from __future__ import annotations

import functools
from importlib import resources

INCLUDE = "--#include "


@functools.cache
def source(name: str) -> str:
    """The text of `<name>.lua`, each line `--#include <chunk>` replaced by `<chunk>.lua`'s text
    (lua/bucket.lua: the token bucket two scripts share)."""
    lines = resources.files(__package__).joinpath(f"{name}.lua").read_text().splitlines(keepends=True)
    return "".join(source(line[len(INCLUDE) :].strip()) if line.startswith(INCLUDE) else line for line in lines)
