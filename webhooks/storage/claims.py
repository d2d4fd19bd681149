"""Claims: one request at a time per lead id or payment reference, released token-safely."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from webhooks.storage.redis import Store

ROUTING = "routing:"  # prefix of a lead claim value while its lead is being routed


@dataclass(frozen=True)
class Claim:
    key: str
    token: str


def new_token(prefix: str = "") -> str:
    return prefix + uuid.uuid4().hex


def claim(store: Store, key: str, ttl_ms: int, token: str | None = None) -> tuple[Claim | None, str | None]:
    """(Claim, None) when we hold `key` now; (None, current value) when someone else does."""
    token = token or new_token()
    result = store.claim_or_get(keys=[key], args=[token, ttl_ms])
    if result[0] == 1:
        return Claim(key, token), None
    return None, result[1]


def release(store: Store, c: Claim) -> bool:
    """Delete the claim only if it still holds our token."""
    return bool(store.release_claim(keys=[c.key], args=[c.token]))
