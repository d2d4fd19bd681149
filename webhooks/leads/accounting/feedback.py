"""Buyer feedback (docs/buyers.md "Feedback"): what a buyer says of one of its own sales, under
its own id for it. Stored once per (buyer, id): sent again, the stored one answers; another
body under that id is a conflict. A sale's first `converted` is counted in the leads report
(reports.count_conversion), in the transaction that stores it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import peewee as pw

from webhooks.errors import Conflict, ValidationError
from webhooks.formats import validate
from webhooks.leads.accounting import reports
from webhooks.storage.records.db import db, is_mysql, retried
from webhooks.storage.records.models import Feedback, Lead, Sale, utcnow
from webhooks.storage.states import FeedbackEvent

CODE = "invalid_feedback"
FIELDS = ("id", "lead_id", "publisher_id", "event", "value")
EVENTS = tuple(str(e) for e in FeedbackEvent)


@dataclass(frozen=True, kw_only=True)
class Given:
    """A feedback as the buyer sent it, checked."""

    feedback_id: str
    publisher_id: str
    lead_id: str
    event: FeedbackEvent
    value: Decimal | None


def parse(body: object) -> Given:
    """The feedback of a request body; ValidationError (400 invalid_feedback) naming the first
    field that is wrong. An empty `value` (a form's field left blank) or a null one is absent."""
    if not isinstance(body, dict):
        raise ValidationError(CODE, "body", 'must be an object {"id", "lead_id", "publisher_id", "event", "value"}')
    for name in body:
        if name not in FIELDS:
            raise ValidationError(CODE, name, "unknown field")
    for name in ("id", "lead_id", "publisher_id"):
        if not validate.is_id(body.get(name)):
            raise ValidationError(CODE, name, "is required: an id of 1-64 characters A-Z a-z 0-9 . _ -")
    event = body.get("event")
    if event not in EVENTS:
        raise ValidationError(CODE, "event", "must be one of " + ", ".join(EVENTS))
    raw = body.get("value")
    value = None
    if raw is not None and raw != "":
        if not isinstance(raw, str):
            raise ValidationError(CODE, "value", 'must be a decimal string such as "120.00"')
        value = validate.money(CODE, "value", raw)
    return Given(
        feedback_id=body["id"],
        publisher_id=body["publisher_id"],
        lead_id=body["lead_id"],
        event=FeedbackEvent(event),
        value=value,
    )


def view(row: Feedback) -> dict[str, Any]:
    """A stored feedback as the buyer API answers it."""
    return {
        "id": row.feedback_id,
        "lead_id": row.lead_id,
        "publisher_id": row.publisher_id,
        "event": row.event,
        "value": None if row.value is None else f"{Decimal(row.value):.2f}",
        "created_at": row.created_at.isoformat() + "Z",
    }


def _same(row: Feedback, given: Given) -> bool:
    value = None if row.value is None else Decimal(row.value)
    stored = (row.publisher_id, row.lead_id, row.event, value)
    return stored == (given.publisher_id, given.lead_id, given.event, given.value)


def record(sale: Sale, given: Given) -> dict[str, Any]:
    """Store the feedback of `sale`'s buyer on it (buyer_sales.own_sale: the caller's sale of
    the lead `given` names), once: the stored feedback, this one or the one stored before under
    its id; Conflict (feedback_conflict) when the id holds another feedback."""
    return retried(lambda: _record(sale, given), "storing a buyer's feedback")


def _record(named: Sale, given: Given) -> dict[str, Any]:
    # SQLite takes the write lock as the transaction begins (db.py SQLite).
    with db.atomic():
        # The sale's row, locked first: feedback on one sale is stored one at a time, so two
        # `converted` sent at once cannot both find none before them. The reads after the lock
        # see what the one before committed (their snapshot starts after it).
        query = Sale.select().where(Sale.id == named.id)
        sale = (query.for_update() if is_mysql() else query).get()
        buyer_id = sale.buyer_id
        insert = Feedback.insert(
            buyer_id=buyer_id,
            feedback_id=given.feedback_id,
            sale_id=sale.id,
            publisher_id=given.publisher_id,
            lead_id=given.lead_id,
            event=given.event,
            value=given.value,
            created_at=utcnow(),
        ).on_conflict_ignore()  # the unique key (buyer_id, feedback_id) decides
        new = db.execute(insert).rowcount == 1
        row = Feedback.get(Feedback.buyer_id == buyer_id, Feedback.feedback_id == given.feedback_id)
        if not new:
            if not _same(row, given):
                raise Conflict(
                    f"feedback {given.feedback_id!r} was sent before with another body", code="feedback_conflict"
                )
            return view(row)
        if given.event == FeedbackEvent.CONVERTED and not _converted_before(sale.id, row.id):
            lead = (
                Lead.select(Lead.received_at)
                .where(Lead.publisher_id == sale.publisher_id, Lead.lead_id == sale.lead_id)
                .get()
            )
            reports.count_conversion(lead.received_at, publisher_id=sale.publisher_id, buyer_id=buyer_id)
        return view(row)


def _converted_before(sale_id: int, row_id: int) -> bool:
    return bool(
        Feedback.select(pw.fn.COUNT(Feedback.id))
        .where(Feedback.sale_id == sale_id, Feedback.event == FeedbackEvent.CONVERTED, Feedback.id != row_id)
        .scalar()
    )


def of_sales(sale_ids: Sequence[int]) -> Mapping[int, list[dict[str, Any]]]:
    """The feedback on each of the sales, oldest first, as a lead's record lists it; one query."""
    out: dict[int, list[dict[str, Any]]] = {}
    if sale_ids:
        for row in Feedback.select().where(Feedback.sale_id.in_(list(sale_ids))).order_by(Feedback.id):
            shown = {k: v for k, v in view(row).items() if k not in ("lead_id", "publisher_id")}
            out.setdefault(row.sale_id, []).append(shown)
    return out
