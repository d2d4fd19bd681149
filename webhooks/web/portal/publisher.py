"""The publisher portal (`/portal/publisher`, docs/api.md "Portals"): a publisher user's own
leads (status, and each sale's payout, held or payable), its statement
(leads/accounting/payout_statement.py), its balance and pre-ping quota
(leads/rules/precheck_quota.py, as the admin API shows it) and a new API key, shown once. Every
route reads the publisher id from the session's user only; another publisher's lead is 404,
the same answer as one that does not exist."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Any

from flask import Blueprint, g, render_template, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.billing.statement import Month
from webhooks.errors import NotFound
from webhooks.leads.accounting import payout_statement
from webhooks.leads.rules import publisher_service
from webhooks.people.accounts import Role
from webhooks.storage.records.models import Lead, Sale
from webhooks.storage.states import LeadStatus
from webhooks.web import sessions
from webhooks.web.http import csv_response

bp = Blueprint("publisher", __name__)
bp.before_request(lambda: sessions.require_portal(Role.PUBLISHER))

PAGE = 50
STATEMENT_LINES = 50
KEY_PREFIX = "pk_"
NOT_YOURS = "no such lead of this publisher"
STATUSES = tuple(str(s) for s in LeadStatus)


def _publisher_id() -> str:
    return str(g.portal_user.publisher_id)


def _overview(api_key: str | None) -> ResponseReturnValue:
    row = publisher_service.existing(_publisher_id())
    shown = publisher_service.shown(services.current().store, [row])[0]
    return render_template("portal_publisher.html", publisher=shown, api_key=api_key)


@bp.get("/portal/publisher")
def home() -> ResponseReturnValue:
    """The publisher's balance (payable), held payouts, pre-ping quota and its use."""
    return _overview(None)


@bp.post("/portal/publisher/key")
def rotate_key() -> ResponseReturnValue:
    """A new API key for the publisher, replacing the old one, shown on this answer only."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = publisher_service.existing(_publisher_id())
    publisher_service.patch(services.current().store, row, {"api_key": key})
    return _overview(key)


def _sales_of(lead_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The publisher's sales of these leads: status, payout and its state, never the buyer."""
    out: dict[str, list[dict[str, Any]]] = {}
    if lead_ids:
        rows = Sale.select().where(Sale.publisher_id == _publisher_id(), Sale.lead_id.in_(lead_ids)).order_by(Sale.id)
        for s in rows:
            out.setdefault(s.lead_id, []).append(
                {
                    "status": s.status,
                    "payout": None if s.payout is None else f"{s.payout:.2f}",
                    "payout_state": s.payout_state,
                }
            )
    return out


def _lead(row: Lead, sales: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "lead_id": row.lead_id,
        "status": row.status,
        "received_at": row.received_at.isoformat() + "Z",
        "sales": sales,
    }


@bp.get("/portal/publisher/leads")
def leads() -> ResponseReturnValue:
    """The publisher's newest leads by arrival (`?lead_id=`, `?status=`; the index on publisher and
    received_at), each with its sales' payouts."""
    conds = [Lead.publisher_id == _publisher_id()]
    lead_id = request.args.get("lead_id") or None
    status = request.args.get("status") or None
    shown = {"args": request.args, "statuses": STATUSES}
    if status is not None and status not in STATUSES:
        error = "status: must be one of " + ", ".join(STATUSES)
        return render_template("portal_leads.html", items=[], error=error, **shown), 400
    if lead_id is not None:
        conds.append(Lead.lead_id == lead_id)
    if status is not None:
        conds.append(Lead.status == status)
    rows = list(Lead.select().where(*conds).order_by(Lead.received_at.desc(), Lead.id.desc()).limit(PAGE))
    sales = _sales_of([r.lead_id for r in rows])
    items = [_lead(r, sales.get(r.lead_id, [])) for r in rows]
    return render_template("portal_leads.html", items=items, **shown)


@bp.get("/portal/publisher/leads/<lead_id>")
def lead(lead_id: str) -> ResponseReturnValue:
    row = Lead.get_or_none(Lead.publisher_id == _publisher_id(), Lead.lead_id == lead_id)
    if row is None:
        raise NotFound(NOT_YOURS)
    return render_template("portal_lead.html", lead=_lead(row, _sales_of([lead_id]).get(lead_id, [])))


def _period() -> Month:
    today = datetime.now(timezone.utc).date()
    return payout_statement.month(request.args.get("month") or today.strftime("%Y-%m"), today)


@bp.get("/portal/publisher/statement")
def statement() -> ResponseReturnValue:
    period = _period()
    summary = payout_statement.summary(_publisher_id(), period, STATEMENT_LINES)
    return render_template("portal_payouts.html", summary=summary, month=period.label)


@bp.get("/portal/publisher/statement.csv")
def statement_csv() -> ResponseReturnValue:
    period = _period()
    name = f"payouts-{_publisher_id()}-{period.label}.csv"
    return csv_response(payout_statement.as_csv(_publisher_id(), period), name)
