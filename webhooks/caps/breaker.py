"""A buyer's circuits as operators see it: its own, for every publisher, and those it has for
single publishers (docs/leads.md "Circuit breakers"). They live in Redis and are changed
only by lua/reserve_lease.lua (a half-open probe) and lua/finish_lease.lua (failures
counted, opened, closed); this reads them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from webhooks.storage.live import keys
from webhooks.storage.live.batch import Client
from webhooks.storage.live.scripts import BREAKER_MEMORY_MS

BREAKER_STATES = ("closed", "open", "half_open")


def _state(open_until_ms: int, now_ms: float) -> str:
    return "closed" if open_until_ms == 0 else "open" if now_ms < open_until_ms else "half_open"


@dataclass(frozen=True)
class Breaker:
    state: str  # of the buyer's own circuit: closed | open | half_open (the next lead probes)
    failures: int  # transport failures in a row (connection errors, timeouts)
    open_until_ms: int
    # the buyer's circuits for single publishers that opened and have not closed since:
    # publisher id -> open | half_open (its next lead probes)
    publishers: tuple[tuple[str, str], ...] = ()

    def of(self, state: str) -> list[str]:
        """The publishers whose circuit at this buyer is in `state` (open, half_open)."""
        return [publisher for publisher, s in self.publishers if s == state]

    def as_json(self) -> dict[str, Any]:
        """As GET /v1/admin/buyers/<id> shows it."""
        return {
            "state": self.state,
            "failures": self.failures,
            "publishers_open": self.of("open"),
            "publishers_half_open": self.of("half_open"),
        }


def breakers(r: Client, buyer_ids: list[str]) -> dict[str, Breaker]:
    """The circuits of each buyer (lua/finish_lease.lua), read in one round trip."""
    pipe = r.pipeline(transaction=False)
    now_ms = time.time() * 1000
    for buyer_id in buyer_ids:
        pipe.hmget(keys.breaker(buyer_id), "open_until", "failures")
        pipe.zrangebyscore(keys.breaker_publishers(buyer_id), now_ms - BREAKER_MEMORY_MS, "+inf", withscores=True)
    replies = pipe.execute()
    out = {}
    for i, buyer_id in enumerate(buyer_ids):
        (open_until, failures), publishers = replies[2 * i], replies[2 * i + 1]
        until = int(open_until or 0)
        out[buyer_id] = Breaker(
            _state(until, now_ms),
            int(failures or 0),
            until,
            tuple((_text(p), _state(int(score), now_ms)) for p, score in publishers),
        )
    return out


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
