"""GET /ops: one server-rendered page for operators, refreshing itself: per buyer, the use of
each cap in its current window, the circuit breaker and, for a billed buyer, its balance;
below, the last leads of the ledger with every attempt's outcome, the payment events not yet
delivered to the application, and the last payment webhooks refused for their signature (from
Redis: they never reach the database)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from flask import Blueprint, render_template, url_for
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.billing import balance
from webhooks.billing.balance import CREDIT, Billing
from webhooks.caps import leases
from webhooks.caps.breaker import breakers
from webhooks.events import endpoints as event_endpoints
from webhooks.events import log as events_log
from webhooks.formats import money
from webhooks.leads.accounting import reports
from webhooks.leads.accounting.ledger import attempts_of, flagged, lead_view, sales_of
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.payments import rejected
from webhooks.storage.live.batch import Client
from webhooks.storage.records.models import Buyer, Lead

bp = Blueprint("page", __name__)

REFRESH_S = 5
LAST_LEADS = 20
LAST_REJECTED = 20


def _bar(cap: str, use: dict[str, Any]) -> dict[str, Any]:
    """A usage bar: used / limit and the filled percentage (a cap of 0 is full)."""
    used, limit = Decimal(str(use["used"])), Decimal(str(use["limit"]))
    pct = 100 if limit == 0 else min(100, int(used * 100 / limit))
    return {"cap": cap, "used": use["used"], "limit": use["limit"], "pct": pct, "window_start": use["window_start"]}


CHART_W, CHART_H, SLOT = 720, 160, 30  # the 24-hour chart: its plot area and one hour's width


def chart(
    hours: list[dict[str, Any]], whole: str = "leads", part: str = "sold", title: str = "Leads and sold leads"
) -> dict[str, Any]:
    """The last hours as an inline SVG's geometry, computed here so the template only places
    it: per hour a bar of `whole` (leads; a buyer's offers) with `part` (sold; its sales) over
    it, and the revenue as a line on a scale of its own. No script: the page's CSP runs none."""
    top = max([h[whole] for h in hours] + [1])
    top_revenue = max([h["revenue"] for h in hours] + [Decimal(1)])
    bars, points = [], []
    for i, h in enumerate(hours):
        x = i * SLOT
        whole_h = round(CHART_H * h[whole] / top)
        part_h = round(CHART_H * h[part] / top)
        bars.append(
            {
                **h,
                "label": h["hour"].strftime("%H:00"),
                "x": x + 4,
                "w": SLOT - 8,
                "leads_y": CHART_H - whole_h,
                "leads_h": whole_h,
                "sold_y": CHART_H - part_h,
                "sold_h": part_h,
            }
        )
        points.append(f"{x + SLOT // 2},{CHART_H - round(CHART_H * h['revenue'] / top_revenue)}")
    return {
        "bars": bars,
        "whole": whole,
        "part": part,
        "title": title,
        "revenue_line": " ".join(points),
        "top_leads": top,
        "top_revenue": f"{top_revenue:.2f}",
        whole: sum(h[whole] for h in hours),
        part: sum(h[part] for h in hours),
        "revenue": f"{sum((h['revenue'] for h in hours), Decimal(0)):.2f}",
        "width": CHART_W,
        "height": CHART_H,
    }


FIGURE_DAYS = 7  # a buyer's page: its figures of today and of the last FIGURE_DAYS days


def buyer_figures(buyer_id: str, now: datetime) -> dict[str, Any]:
    """A buyer's figures as the report by buyer has them (leads/accounting/reports.py: the same
    query on lead_stats_days, the same arithmetic): today's (UTC) and the last FIGURE_DAYS days',
    each with the report's range to check it against; and its offers and sales per hour over
    the last 24 hours."""
    today = now.astimezone(timezone.utc).date()
    periods = []
    for label, first in (("today", today), (f"last {FIGURE_DAYS} days", today - timedelta(days=FIGURE_DAYS - 1))):
        totals = reports.as_json(reports.report(first, today, "buyer", buyer_id=buyer_id))["totals"]
        days: dict[str, Any] = {"from": first.isoformat(), "to": today.isoformat()}
        report = url_for("ops.reports.reports", group_by="buyer", **days)
        periods.append({"label": label, "report": report, **totals})
    return {
        "periods": periods,
        "chart": chart(reports.last_hours(now, buyer_id=buyer_id), "offers", "sales", "Offers and sales"),
    }


def billing_panels(rows: list[Buyer]) -> dict[str, dict[str, Any]]:
    """Each billed buyer's billing and balance, by buyer id (billing/balance.py:shown_many: the
    wallets in one query, Redis in one round trip); `available` null while Redis does not
    know the balance (a rebuild after a data loss)."""
    billed = [(row.id, billing) for row in rows if (billing := Billing.from_json(row.billing)) is not None]
    shown = balance.shown_many(services.current().store, billed)
    return {
        buyer_id: {
            "mode": billing.mode,
            "account": billing.account,
            "credit_limit": None
            if billing.mode != CREDIT
            else money.text(billing.credit_limit_minor, billing.currency),
            **shown[buyer_id],
        }
        for buyer_id, billing in billed
    }


def buyer_panels(r: Client, now: datetime) -> list[dict[str, Any]]:
    """Every buyer not deleted, in waterfall order, with its cap bars, breaker and balance."""
    rows = list(Buyer.select().where(Buyer.deleted_at.is_null()).order_by(Buyer.priority, Buyer.price.desc(), Buyer.id))
    states = breakers(r, [row.id for row in rows])
    billing = billing_panels(rows)
    usage = leases.usage_many(r, [BuyerRule.from_row(row) for row in rows], now)
    return [
        {
            "id": row.id,
            "name": row.name,
            "active": bool(row.active),
            "price": f"{row.price:.2f}",
            "breaker": states[row.id],
            "bars": [_bar(cap, use) for cap, use in usage[row.id].items()],
            "billing": billing.get(row.id),
        }
        for row in rows
    ]


def event_panel() -> dict[str, Any]:
    """The endpoints with their state, backlog and last error, and the last failed dispatches."""
    backlog = events_log.backlog()
    panels = []
    for row in event_endpoints.listing():
        url = urlsplit(row.url)
        state = "enabled" if row.enabled else f"disabled: {row.disabled_reason or 'paused'}"
        panels.append(
            {
                "id": row.id,
                "where": f"{url.scheme}://{url.netloc}{url.path}",  # a query string may carry a token
                "state": state,
                "enabled": bool(row.enabled),
                "since": row.disabled_at if not row.enabled else row.failing_since,
                "failing": row.failing_since is not None,
                "counts": backlog.get(row.id, {"pending": 0, "failed": 0}),
                "last_error": row.last_error,
                "last_success_at": row.last_success_at,
            }
        )
    failed, _ = events_log.search(status="failed", limit=LAST_LEADS)
    return {
        "endpoints": panels,
        "pending": sum(p["counts"]["pending"] for p in panels),
        "failed_count": sum(p["counts"]["failed"] for p in panels),
        "failed": failed,
        "waiting": events_log.not_fanned_out(),
    }


@bp.get("/ops")
def ops_page() -> ResponseReturnValue:
    r = services.current().store.redis
    rows = list(Lead.select().order_by(Lead.id.desc()).limit(LAST_LEADS))  # the last settled, by key
    flagged_rows = flagged(LAST_LEADS)
    sales = sales_of([*rows, *flagged_rows])  # every lead's sales in two queries
    attempts = attempts_of([*rows, *flagged_rows])  # and their attempts in one
    leads = [
        lead_view(row, attempts[(row.publisher_id, row.lead_id)], sales[(row.publisher_id, row.lead_id)])
        for row in sorted(rows, key=lambda row: row.received_at, reverse=True)
    ]
    review = [
        lead_view(row, attempts[(row.publisher_id, row.lead_id)], sales[(row.publisher_id, row.lead_id)])
        for row in flagged_rows
    ]
    events = event_panel()
    now = datetime.now(timezone.utc)
    yesterday, today = (now - timedelta(days=1)).date().isoformat(), now.date().isoformat()
    csv_range: dict[str, Any] = {"from": yesterday, "to": today, "group_by": "hour"}
    html = render_template(
        "ops.html",
        section="ops.page.ops_page",
        buyers=buyer_panels(r, datetime.now(timezone.utc)),
        leads=leads,
        review=review,
        events=events,
        chart=chart(reports.last_hours(now)),
        report_days=(yesterday, today),
        report_csv=url_for("ops.reports.reports_csv", **csv_range),
        rejected=rejected.listing(r, limit=LAST_REJECTED),
        refresh_s=REFRESH_S,
        now=now,
    )
    return html, 200, {"Cache-Control": "no-store"}
