"""Floodgate's Lua scripts, one per file (verb_noun.lua), shipped as package data.

webhooks/storage/redis.py registers each once per client with redis-py's `register_script`,
whose Script object calls EVALSHA and falls back to EVAL by itself after a Redis restart has
emptied the script cache (the way alisaifee/limits loads its scripts); a batch of calls
(webhooks/storage/batch.py) sends their text with EVAL.
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def source(name: str) -> str:
    """The text of `<name>.lua`."""
    return resources.files(__package__).joinpath(f"{name}.lua").read_text()
