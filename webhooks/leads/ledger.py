"""The lead ledger: idempotent settlement writes and the reads built on them."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from decimal import Decimal

import peewee as pw

from webhooks.events import outbox
from webhooks.leads.delivery import UNKNOWN
from webhooks.leads.reports import count_settled
from webhooks.storage import audit
from webhooks.storage.db import db
from webhooks.storage.models import Lead, LeadAttempt, Publisher, utcnow
from webhooks.storage.states import TEST_STATUSES

log = logging.getLogger(__name__)


def _naive_utc(iso: str | None) -> datetime | None:
    if iso is None:
        return None
    return datetime.fromisoformat(iso).replace(tzinfo=None)


def _lead_row(item: dict, now: datetime) -> dict:
    return {
        "publisher_id": item["publisher_id"],
        "lead_id": item["lead_id"],
        "status": item["status"],
        "buyer_id": item["buyer_id"],
        "price": item["price"],
        "commission": item["commission"],
        "payload": item["payload"],
        "received_at": _naive_utc(item["received_at"]),
        "sold_at": _naive_utc(item["sold_at"]),
        "settled_at": now,
        "request_id": item.get("request_id"),
        "lease_id": item["lease"][1] if item.get("lease") else None,
        "reserved_us": item.get("reserved_us"),
        "skipped": json.dumps(item["skipped"], separators=(",", ":")) if item.get("skipped") else None,
    }


def _write_extras(new: list[dict], now: datetime) -> None:
    """Attempts, commission, report, event and audit rows of leads whose row was just inserted:
    a sale's `lead.sold` event is written with it (none for a test lead: never a sale)."""
    attempts = [
        {
            "publisher_id": i["publisher_id"],
            "lead_id": i["lead_id"],
            "seq": seq,
            "buyer_id": a["buyer_id"],
            "outcome": a["outcome"],
            "ms": a["ms"],
            "bid": a.get("bid"),
        }
        for i in new
        for seq, a in enumerate(i["attempts"], 1)
    ]
    if attempts:
        LeadAttempt.insert_many(attempts).execute()
    commissions: dict[str, Decimal] = {}
    for i in new:
        if i["commission"]:
            commissions[i["publisher_id"]] = commissions.get(i["publisher_id"], 0) + Decimal(i["commission"])
    for publisher_id, amount in commissions.items():
        if amount > 0:
            Publisher.update(balance=Publisher.balance + amount).where(Publisher.id == publisher_id).execute()
    count_settled(new)
    outbox.record_many(
        [
            outbox.lead_event(outbox.EventType.LEAD_SOLD, i["publisher_id"], i["lead_id"], _payout(i))
            for i in new
            if i["status"] == "sold"
        ],
        now,
    )
    audit.record_many(
        "settlement",
        "lead",
        [
            (
                f"lead.{i['status']}",
                f"{i['publisher_id']}:{i['lead_id']}",
                {
                    "buyer_id": i["buyer_id"],
                    "price": i["price"],
                    "commission": i["commission"],
                    "attempts": len(i["attempts"]),
                },
            )
            for i in new
        ],
    )


def _payout(item: dict) -> str:
    return f"{Decimal(item['commission'] or 0):.2f}"


def settle(items: list[dict]) -> int:
    """Write settlements; return how many were new. Safe to repeat: the lead's unique key
    (publisher, lead_id) decides, and only a new lead row brings its attempts, commission and
    audit entry. A batch is written with a handful of statements in one transaction; if any
    lead of it was settled before, the batch is written again lead by lead."""
    now = utcnow()
    unique = list({(i["publisher_id"], i["lead_id"]): i for i in items}.values())
    try:
        with db.atomic():
            Lead.insert_many([_lead_row(i, now) for i in unique]).execute()
            _write_extras(unique, now)
        return len(unique)
    except pw.IntegrityError:
        pass  # some were settled before (a job run again): decide one by one
    written = 0
    with db.atomic():
        for item in unique:
            query = Lead.insert(**_lead_row(item, now)).on_conflict_ignore()
            if db.execute(query).rowcount == 1:
                written += 1
                _write_extras([item], now)
    return written


def _attempt(a: LeadAttempt) -> dict:
    out = {"buyer_id": a.buyer_id, "outcome": a.outcome, "ms": a.ms}
    if a.bid is not None:
        out["bid"] = f"{Decimal(a.bid):.2f}"
    return out


def lead_record(lead: Lead) -> dict:
    attempts = (
        LeadAttempt.select()
        .where(LeadAttempt.publisher_id == lead.publisher_id, LeadAttempt.lead_id == lead.lead_id)
        .order_by(LeadAttempt.seq)
    )
    test = lead.status in TEST_STATUSES  # recorded as test_sold / test_unsold: never a sale
    return {
        "lead_id": lead.lead_id,
        "publisher_id": lead.publisher_id,
        "status": TEST_STATUSES.get(lead.status, lead.status),
        "test": test,
        "buyer_id": lead.buyer_id,
        "price": None if lead.price is None else f"{Decimal(lead.price):.2f}",
        "commission": None if lead.commission is None else f"{Decimal(lead.commission):.2f}",
        "attempts": [_attempt(a) for a in attempts],
        # a buyer may hold this lead without it being sold (its routing died): see API.md
        "review": any(a.outcome == UNKNOWN for a in attempts),
        "skipped": json.loads(lead.skipped) if lead.skipped else [],
        "returned_at": None if lead.returned_at is None else lead.returned_at.isoformat() + "Z",
        "return_reason": lead.return_reason,
        "received_at": lead.received_at.isoformat() + "Z",
        "settled_at": lead.settled_at.isoformat() + "Z",
    }


def answer_for(publisher_id: str, lead_id: str) -> dict | None:
    """The answer the publisher was given for a settled lead (as settlement.answer_of made
    it), or None when the ledger has no such lead."""
    lead = Lead.get_or_none(Lead.publisher_id == publisher_id, Lead.lead_id == lead_id)
    if lead is None:
        return None
    record = lead_record(lead)
    answer = {k: record[k] for k in ("lead_id", "status", "buyer_id", "price", "attempts")}
    if answer["status"] == "returned":  # returned since: the publisher was told it was sold
        answer["status"] = "sold"
    if record["test"]:
        answer["test"] = True
    return answer


def flagged(limit: int = 50) -> list[Lead]:
    """Leads flagged for review, newest first: an attempt of theirs ended `unknown` (a buyer
    may hold the lead, unsold: its routing died and the buyer did not confirm the re-offer)."""
    pairs = LeadAttempt.select(LeadAttempt.publisher_id, LeadAttempt.lead_id).where(LeadAttempt.outcome == UNKNOWN)
    return list(
        Lead.select()
        .where(pw.Tuple(Lead.publisher_id, Lead.lead_id).in_(pairs))
        .order_by(Lead.received_at.desc())
        .limit(limit)
    )
