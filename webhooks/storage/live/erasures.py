"""The erasure feed: every web process's journal (leads/path/settlement.py) reads the leads
whose personal data was erased and drops their bodies, then says how far it read; the erasure
waits for the word of every journal that is alive (docs/leads.md "Erasure")."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import cast

from webhooks.storage.live import keys
from webhooks.storage.live.batch import Client

ALIVE_MS = 5_000  # a journal that said nothing for this long is not waited for (it looks every 0.5 s)
STALE_MS = 3_600_000  # then its word is deleted
READ_COUNT = 1_000  # erasures read per round trip
START = "0-0"  # before every stream id


def _id(raw: str) -> tuple[int, int]:
    ms, _, seq = raw.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True, kw_only=True)
class Read:
    """What a journal read of the feed: the erased leads (publisher_id, lead_id) and the id of
    the last one (its `after` unchanged when there were none)."""

    leads: frozenset[tuple[str, str]]
    last: str


def announce(client: Client, *, lead: tuple[str, str], keep_s: float) -> str:
    """Add `lead` to the feed and return its id. Entries older than the journals keep their
    settlements (`keep_s`, JOURNAL_KEEP_S) are trimmed: no journal holds those leads any more."""
    oldest = int(time.time() * 1000 - keep_s * 1000) - ALIVE_MS
    added = client.xadd(keys.ERASURES, {"p": lead[0], "l": lead[1]}, minid=max(oldest, 0), approximate=True)
    return cast(str, added)


def read(client: Client, *, process: str, after: str) -> Read:
    """The erasures after `after`, read in the round trip that says this process is alive and
    has dropped the bodies of every erasure up to `after` (its word, `acknowledge`)."""
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.ERASURES_SEEN, process, f"{after}|{int(time.time() * 1000)}")
    pipe.xrange(keys.ERASURES, min="(" + after, count=READ_COUNT)
    _, entries = pipe.execute()
    leads: set[tuple[str, str]] = set()
    last = after
    while entries:
        for entry_id, fields in entries:
            leads.add((fields.get("p", ""), fields.get("l", "")))
            last = entry_id
        if len(entries) < READ_COUNT:
            break
        entries = client.xrange(keys.ERASURES, min="(" + last, count=READ_COUNT)
    return Read(leads=frozenset(leads), last=last)


def acknowledge(client: Client, *, process: str, last: str) -> None:
    """Say that this process has dropped the bodies of every erasure up to `last`."""
    client.hset(keys.ERASURES_SEEN, process, f"{last}|{int(time.time() * 1000)}")


def forgotten_everywhere(client: Client, announced: str) -> bool:
    """Whether every live journal has said it dropped the erasure `announced` (and those
    before it). The word of a process gone for an hour is deleted."""
    now = int(time.time() * 1000)
    seen = cast("dict[str, str]", client.hgetall(keys.ERASURES_SEEN))
    waiting, stale = False, []
    for process, word in seen.items():
        last, _, at = word.partition("|")
        if not at.isdigit() or int(at) < now - STALE_MS:
            stale.append(process)
        elif int(at) >= now - ALIVE_MS and _id(last) < _id(announced):
            waiting = True
    if stale:
        client.hdel(keys.ERASURES_SEEN, *stale)
    return not waiting
