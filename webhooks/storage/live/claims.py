"""Claims: one request at a time per lead id or payment reference, released token-safely."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from webhooks.storage.live import keys
from webhooks.storage.live.redis import Store

ROUTING = "routing:"  # prefix of a lead claim value while its lead is being routed
LATE_S = 1.0  # this close to its claim's expiry, a lead's routing checks it still holds the claim


@dataclass(frozen=True)
class Claim:
    key: str
    token: str


def new_token(prefix: str = "") -> str:
    return prefix + secrets.token_hex(16)


def claim(store: Store, key: str, ttl_ms: int, token: str | None = None) -> tuple[Claim | None, str | None]:
    """(Claim, None) when we hold `key` now; (None, current value) when someone else does."""
    token = token or new_token()
    result = store.claim_or_get(key, token, ttl_ms)
    return (Claim(key, token), None) if result.claimed else (None, result.held)


def release(store: Store, c: Claim) -> bool:
    """Delete the claim only if it still holds our token."""
    return store.release_claim(c.key, c.token)


def remember_from_start(store: Store, publisher_id: str) -> None:
    """Mark a new publisher's replay memory complete: Redis holds every answer it will be
    given (lua/claim_lead.lua). Only for a publisher the ledger has no lead of."""
    store.redis.set(keys.lead_memory(publisher_id), "0", nx=True)


def memory_gap(mark: str | int | None, now_ms: int, replay_ttl_s: int) -> bool:
    """Whether a lead with no claim may still have been answered before Redis lost its
    memory: the mark (claim_lead.lua) is younger than the replay window. One piece of the
    recovery from a Redis data loss: see docs/architecture.md "When Redis loses its data"."""
    since = int(mark or 0)
    return since > 0 and now_ms - since < replay_ttl_s * 1000
