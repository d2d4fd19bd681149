"""The lead ledger: idempotent settlement writes and the reads built on them."""
from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal

from . import audit
from .db import db
from .models import Lead, LeadAttempt, Publisher, utcnow

log = logging.getLogger(__name__)


def _naive_utc(iso: str | None) -> datetime | None:
    if iso is None:
        return None
    return datetime.fromisoformat(iso).replace(tzinfo=None)


def settle(items: list[dict]) -> int:
    """Write settlements in one transaction; return how many were new. Safe to repeat:
    the lead's unique key (publisher, lead_id) decides, and only a new lead row accrues
    commission, attempts and an audit entry."""
    written = 0
    with db.atomic():
        for item in items:
            query = Lead.insert(
                publisher_id=item["publisher_id"], lead_id=item["lead_id"], status=item["status"],
                buyer_id=item["buyer_id"], price=item["price"], commission=item["commission"],
                payload=item["payload"], received_at=_naive_utc(item["received_at"]),
                sold_at=_naive_utc(item["sold_at"]), settled_at=utcnow(), request_id=item.get("request_id"),
                lease_id=item["lease"][1] if item.get("lease") else None, reserved_us=item.get("reserved_us"),
            ).on_conflict_ignore()
            if db.execute(query).rowcount != 1:
                continue  # settled before: nothing is written twice
            written += 1
            if item["attempts"]:
                LeadAttempt.insert_many([
                    {"publisher_id": item["publisher_id"], "lead_id": item["lead_id"], "seq": seq,
                     "buyer_id": a["buyer_id"], "outcome": a["outcome"], "ms": a["ms"]}
                    for seq, a in enumerate(item["attempts"], 1)
                ]).on_conflict_ignore().execute()
            if item["commission"] and Decimal(item["commission"]) > 0:
                (Publisher.update(balance=Publisher.balance + Decimal(item["commission"]))
                 .where(Publisher.id == item["publisher_id"]).execute())
            audit.record("settlement", f"lead.{item['status']}", "lead",
                         f"{item['publisher_id']}:{item['lead_id']}",
                         {"buyer_id": item["buyer_id"], "price": item["price"],
                          "commission": item["commission"], "attempts": len(item["attempts"])})
    return written


def sold_since(buyer_id: str, since: datetime) -> list[tuple]:
    """(publisher_id, lead_id, sold_at naive UTC, price, lease_id, reserved_us) of the buyer's
    sales since `since`."""
    rows = (Lead.select(Lead.publisher_id, Lead.lead_id, Lead.sold_at, Lead.price, Lead.lease_id,
                        Lead.reserved_us)
            .where(Lead.buyer_id == buyer_id, Lead.status == "sold",
                   Lead.sold_at >= since.replace(tzinfo=None)).tuples())
    return list(rows)


def lead_record(lead: Lead) -> dict:
    attempts = (LeadAttempt.select().where(LeadAttempt.publisher_id == lead.publisher_id,
                                           LeadAttempt.lead_id == lead.lead_id)
                .order_by(LeadAttempt.seq))
    return {
        "lead_id": lead.lead_id,
        "publisher_id": lead.publisher_id,
        "status": lead.status,
        "buyer_id": lead.buyer_id,
        "price": None if lead.price is None else f"{Decimal(lead.price):.2f}",
        "commission": None if lead.commission is None else f"{Decimal(lead.commission):.2f}",
        "attempts": [{"buyer_id": a.buyer_id, "outcome": a.outcome, "ms": a.ms} for a in attempts],
        "received_at": lead.received_at.isoformat() + "Z",
        "settled_at": lead.settled_at.isoformat() + "Z",
    }
