"""Payment webhooks that failed their signature check (docs/api.md "Operations"): anyone can send
one, so each costs one Redis round trip and never the database, not even a connection. What
is kept is what Floodgate measured, never what the sender chose: provider, body length and
SHA-256, arrival time and the request id, in a list capped at the last KEEP (one key: one
slot on a Redis Cluster). The admin API and /ops read it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import cast

from webhooks.payments.ledger import Receipt
from webhooks.storage.live import keys
from webhooks.storage.live.batch import Client

log = logging.getLogger(__name__)

KEEP = 1000


@dataclass(frozen=True)
class RejectedWebhook:
    provider: str
    body_length: int
    body_sha256: str
    received_at: str  # ISO 8601, UTC
    request_id: str | None


@dataclass(frozen=True)
class Listing:
    count: int  # entries in the list, all providers
    entries: list[RejectedWebhook]  # newest first


def add(redis: Client, d: Receipt, request_id: str | None) -> None:
    """Push the webhook's metadata and trim the list, in one MULTI/EXEC round trip (a
    transaction on one key works on a cluster too), so it never holds more than KEEP."""
    entry = RejectedWebhook(d.provider, d.length, d.sha256, d.received_at.isoformat() + "Z", request_id)
    pipe = redis.pipeline(transaction=True)
    pipe.lpush(keys.REJECTED_WEBHOOKS, json.dumps(asdict(entry), separators=(",", ":")))
    pipe.ltrim(keys.REJECTED_WEBHOOKS, 0, KEEP - 1)
    pipe.execute()


def _parse(raw: str) -> RejectedWebhook | None:
    try:
        return RejectedWebhook(**json.loads(raw))
    except (ValueError, TypeError):  # not one of ours: skipped rather than a 500
        log.warning("unreadable entry in %s skipped", keys.REJECTED_WEBHOOKS)
        return None


def listing(redis: Client, provider: str | None = None, limit: int = KEEP) -> Listing:
    """The newest `limit` entries (of `provider` only, if given) and the list's length. Two
    plain commands, not a pipeline: an unreachable cluster then is a 503 (storage/live/redis.py
    maps it for single commands only), and this is read by operators, not by the flood."""
    count = redis.llen(keys.REJECTED_WEBHOOKS)
    raws = cast(
        "list[str]",
        redis.lrange(
            keys.REJECTED_WEBHOOKS,
            0,  # decoded replies
            (limit if provider is None else KEEP) - 1,
        ),
    )
    entries = [e for e in map(_parse, raws) if e is not None and provider in (None, e.provider)]
    return Listing(count, entries[:limit])
