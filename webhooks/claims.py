"""Claims: one request at a time per lead id or payment reference, released token-safely."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

ROUTING = "routing:"  # prefix of a lead claim value while its lead is being routed


@dataclass(frozen=True)
class Claim:
    key: str
    token: str


def new_token(prefix: str = "") -> str:
    return prefix + uuid.uuid4().hex


def claim(r, key: str, ttl_ms: int, token: str | None = None) -> tuple[Claim | None, str | None]:
    """(Claim, None) when we hold `key` now; (None, current value) when someone else does."""
    token = token or new_token()
    result = r.scripts.claim_or_get(keys=[key], args=[token, ttl_ms])
    if result[0] == 1:
        return Claim(key, token), None
    return None, result[1]


def release(r, c: Claim) -> bool:
    """Delete the claim only if it still holds our token."""
    return bool(r.scripts.release_claim(keys=[c.key], args=[c.token]))
