"""Who a lead's consumer is, for per-buyer duplicate suppression (docs/api.md "dedupe").

A buyer's dedupe fields of a lead, as their consumer keys (webhooks/formats/consumer.py, the one
normaliser) hashed, name keys beside the buyer's cap keys (same hash tag). lua/reserve_lease.lua
refuses the buyer when one exists and sets them with the reservation (one atomic step); a
refund deletes them again (lua/finish_lease.lua).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from webhooks.formats import consumer
from webhooks.storage.live import keys, settle_queue
from webhooks.storage.live.batch import Client
from webhooks.storage.live.redis import Store
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, Sale
from webhooks.storage.states import SaleStatus


def consumer_keys(buyer_id: str, fields: Iterable[str], values: Mapping[str, str | None]) -> list[str]:
    """The dedupe keys at `buyer_id` of a consumer whose keys (webhooks/formats/consumer.py) are
    `values` (none when no field is present)."""
    out = []
    for field in fields:
        value = values.get(field)
        if value is not None:
            digest = hashlib.blake2b(value.encode(), digest_size=12).hexdigest()
            out.append(keys.dedupe(buyer_id, field, digest))
    return out


def stored_consumer_keys(buyer_id: str, fields: Iterable[str], lead: Mapping[str, Any]) -> list[str]:
    """`consumer_keys` of a lead as the ledger keeps it."""
    names = tuple(fields)
    return consumer_keys(buyer_id, names, consumer.stored_keys_of(lead, names))


def sold_consumers(
    queue_redis: Client,
    buyer_id: str,
    *,
    fields: Sequence[str],
    days: int,
    now: datetime,
    pending: list[dict[str, Any]] | None = None,
) -> dict[str, int]:
    """Dedupe key -> when it expires (unix ms) of every consumer `buyer_id` bought within its
    dedupe `days`, found by its dedupe `fields`, from the ledger and the settlements not yet
    in it (`pending`, when the caller already read them)."""
    if not fields:
        return {}
    window_ms = days * 86_400_000
    since = now - timedelta(days=days)
    sales: list[tuple[datetime, str]] = []
    for item in settle_queue.unsettled(queue_redis, mentioning=buyer_id) if pending is None else pending:
        for sale in settle_queue.sales_in(item):
            if sale["buyer_id"] == buyer_id:
                sales.append((datetime.fromisoformat(sale["sold_at"]).astimezone(timezone.utc), item["payload"]))
    with db.connection_context():
        rows = (
            Sale.select(Sale.sold_at, Lead.payload)
            .join(Lead, on=(Lead.publisher_id == Sale.publisher_id) & (Lead.lead_id == Sale.lead_id))
            .where(
                Sale.buyer_id == buyer_id,
                Sale.status != SaleStatus.RETURNED,
                Sale.sold_at >= since.replace(tzinfo=None),
            )
            .tuples()
        )
        sales += [
            (sold_at.replace(tzinfo=timezone.utc), payload)
            for sold_at, payload in cast("Iterable[tuple[datetime, str]]", rows)
        ]  # .tuples(): see sales.py
    out: dict[str, int] = {}
    for sold_at, payload in sales:
        try:
            lead = json.loads(payload)
        except ValueError:
            continue
        if isinstance(lead, dict):
            until = int(sold_at.timestamp() * 1000) + window_ms
            for key in stored_consumer_keys(buyer_id, fields, lead):
                out[key] = max(out.get(key, 0), until)
    return out


def restore(
    store: Store,
    queue_redis: Client,
    buyer_id: str,
    *,
    fields: Sequence[str],
    days: int,
    now: datetime,
    pending: list[dict[str, Any]] | None = None,
) -> int:
    """Set the dedupe keys of `buyer_id`'s sales within its dedupe window (`fields`, `days`)
    that Redis lacks (after a data loss, or drift); never shortens or removes one. Returns how
    many were missing."""
    remembered = sold_consumers(queue_redis, buyer_id, fields=fields, days=days, now=now, pending=pending)
    now_ms = int(now.timestamp() * 1000)
    live = {k: at for k, at in remembered.items() if at > now_ms}
    if not live:
        return 0
    pipe = store.redis.pipeline(transaction=False)
    for key, at in live.items():
        pipe.set(key, "ledger", pxat=at, nx=True)
    return sum(1 for done in pipe.execute() if done)
