"""A buyer's circuit breaker as operators see it. The breaker itself lives in Redis and is
changed only by lua/reserve_lease.lua (a half-open probe) and lua/finish_lease.lua
(failures counted, opened, closed); this reads it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from webhooks.storage import keys
from webhooks.storage.batch import Client

BREAKER_STATES = ("closed", "open", "half_open")


@dataclass(frozen=True)
class Breaker:
    state: str  # closed | open | half_open (open_until passed: the next lead is a probe)
    failures: int
    open_until_ms: int


def breakers(r: Client, buyer_ids: list[str]) -> dict[str, Breaker]:
    """The circuit breaker of each buyer (lua/reserve_lease.lua), read in one round trip."""
    pipe = r.pipeline(transaction=False)
    for buyer_id in buyer_ids:
        pipe.hmget(keys.breaker(buyer_id), "open_until", "failures")
    now_ms = time.time() * 1000
    out = {}
    for buyer_id, (open_until, failures) in zip(buyer_ids, pipe.execute()):
        until = int(open_until or 0)
        state = "closed" if until == 0 else "open" if now_ms < until else "half_open"
        out[buyer_id] = Breaker(state, int(failures or 0), until)
    return out
