"""GET /ops: one server-rendered page for operators, refreshing itself: per buyer, the use of
each cap in its current window and the circuit breaker; below, the last leads of the ledger
with every attempt's outcome, the payment events not yet delivered to the application, and the
last payment webhooks refused for their signature (from Redis: they never reach the database)."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from flask import render_template
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.caps import leases
from webhooks.caps.breaker import breakers
from webhooks.leads.buyers import BuyerRule
from webhooks.leads.ledger import flagged, lead_record
from webhooks.payments import outbox, rejected
from webhooks.storage.batch import Client
from webhooks.storage.models import Buyer, Lead
from webhooks.web.ops import bp
from webhooks.web.ops.auth import require_admin

REFRESH_S = 5
LAST_LEADS = 20
LAST_REJECTED = 20


def _bar(cap: str, use: dict[str, Any]) -> dict[str, Any]:
    """A usage bar: used / limit and the filled percentage (a cap of 0 is full)."""
    used, limit = Decimal(str(use["used"])), Decimal(str(use["limit"]))
    pct = 100 if limit == 0 else min(100, int(used * 100 / limit))
    return {"cap": cap, "used": use["used"], "limit": use["limit"], "pct": pct, "window_start": use["window_start"]}


def buyer_panels(r: Client, now: datetime) -> list[dict[str, Any]]:
    """Every buyer not deleted, in waterfall order, with its cap bars and breaker."""
    rows = list(Buyer.select().where(Buyer.deleted_at.is_null()).order_by(Buyer.priority, Buyer.price.desc(), Buyer.id))
    states = breakers(r, [row.id for row in rows])
    return [
        {
            "id": row.id,
            "name": row.name,
            "active": bool(row.active),
            "price": f"{row.price:.2f}",
            "breaker": states[row.id],
            "bars": [_bar(cap, use) for cap, use in leases.usage(r, BuyerRule.from_row(row), now).items()],
        }
        for row in rows
    ]


@bp.get("/ops")
def ops_page() -> ResponseReturnValue:
    redirect = require_admin()
    if redirect is not None:
        return redirect
    r = services.current().store.redis
    rows = Lead.select().order_by(Lead.id.desc()).limit(LAST_LEADS)  # the last settled, by key
    leads = [lead_record(row) for row in sorted(rows, key=lambda row: row.received_at, reverse=True)]
    review = [lead_record(row) for row in flagged(LAST_LEADS)]
    events = {"counts": outbox.counts(), "failed": outbox.listing((outbox.FAILED,), LAST_LEADS)}
    html = render_template(
        "ops.html",
        buyers=buyer_panels(r, datetime.now(timezone.utc)),
        leads=leads,
        review=review,
        events=events,
        rejected=rejected.listing(r, limit=LAST_REJECTED),
        refresh_s=REFRESH_S,
        now=datetime.now(timezone.utc),
    )
    return html, 200, {"Cache-Control": "no-store"}
