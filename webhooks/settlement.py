"""Handing a routed lead to the ledger: the item, its queue in Redis, and what is unsettled.

Settlements go to one Redis list that a single RQ job drains in batches, so intake at
hundreds of leads a second costs one LPUSH each, not one forked job each.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from workers.queues import enqueue_drain

from . import keys
from typing import TYPE_CHECKING

from .publishers import PublisherRule

if TYPE_CHECKING:
    from .routing import Outcome

log = logging.getLogger(__name__)

SCHEDULED_TTL_MS = 60_000
CENTS = Decimal("0.01")


def commission(price: Decimal, pct: Decimal) -> Decimal:
    return (price * pct / 100).quantize(CENTS, rounding=ROUND_HALF_UP)


def make_item(publisher: PublisherRule, lead_id: str, outcome: Outcome, payload: str,
              received_at: datetime, request_id: str | None) -> dict:
    sold = outcome.status == "sold"
    return {
        "publisher_id": publisher.id,
        "lead_id": lead_id,
        "status": outcome.status,
        "buyer_id": outcome.buyer_id,
        "price": f"{outcome.price:.2f}" if sold else None,
        "commission": f"{commission(outcome.price, publisher.commission_pct):.2f}" if sold else None,
        "attempts": outcome.attempts,
        "payload": payload,
        "received_at": received_at.isoformat(),
        "sold_at": outcome.sold_at.isoformat() if sold else None,
        "lease": [outcome.lease.buyer_id, outcome.lease.lease_id] if sold else None,
        "request_id": request_id,
    }


def push(settle_r, queue, item: dict, pipe=None) -> None:
    """Queue `item` for the ledger; start a drain job unless one is already scheduled.

    `pipe` lets the caller send its own commands in the same round trip."""
    own = pipe is None
    pipe = settle_r.pipeline(transaction=False) if own else pipe
    pipe.lpush(keys.SETTLE_PENDING, json.dumps(item, separators=(",", ":")))
    pipe.set(keys.SETTLE_SCHEDULED, "1", nx=True, px=SCHEDULED_TTL_MS)
    scheduled = pipe.execute()[-1]
    if scheduled:
        enqueue_drain(queue, request_id=item.get("request_id"))


def unsettled(settle_r) -> list[dict]:
    """Every settlement not yet in the ledger: pending, or taken by a job not yet done."""
    raw = list(settle_r.lrange(keys.SETTLE_PENDING, 0, -1))
    for key in settle_r.scan_iter(match=keys.settle_processing("*"), count=500):
        raw += settle_r.lrange(key, 0, -1)
    return [json.loads(x) for x in raw]


def settle_directly(item: dict) -> None:
    """Write one settlement synchronously: the fallback when its queue is unreachable."""
    from .db import UNAVAILABLE_ERRORS, db
    from .ledger import settle

    try:
        with db.connection_context():
            settle([item])
        log.warning("settlement queue unreachable: lead %s:%s written directly",
                    item["publisher_id"], item["lead_id"])
    except UNAVAILABLE_ERRORS:
        log.error("settlement LOST from queue and database, recover it from this line: %s",
                  json.dumps(item))
