"""The console's publishers: the list, the form that creates one (its API key made here and
shown once, or the operator's own), and each publisher's page (edit, pause and resume, a new
key, cap use, its audit log). Every change goes through the admin API's own service
(leads/rules/publisher_service.py)."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import ValidationError
from webhooks.formats.validate import is_id, merge_patch
from webhooks.leads.accounting import payout_statement
from webhooks.leads.rules import publisher_service, publishers
from webhooks.leads.rules.publishers import MODES, PUBLISHER_CAPS, ROUTING_MODES
from webhooks.storage.records.models import Publisher
from webhooks.web.http import csv_response
from webhooks.web.listing import page_of
from webhooks.web.ops import forms
from webhooks.web.ops.console import audit_rows, done, page
from webhooks.web.ops.forms import CHECKBOX, JSON, LIST, NUMBER, SECRET, SELECT, Field

bp = Blueprint("publishers", __name__)

SECTION = "ops.publishers.publishers"
STATEMENT_LINES = 50  # the newest lines of the month the page shows; the CSV has them all

FIELDS = (
    Field("name", "Name", required=True),
    Field("api_key", "API key", SECRET, hint="empty: kept (a new one: the button above, or one of 16+ characters)"),
    Field("payout.type", "Payout", SELECT, choices=("percent", "fixed")),
    Field("payout.pct", "Payout percent", hint="of the sale price, for a percent payout"),
    Field("payout.amount", "Payout amount", hint="per sold lead, for a fixed payout"),
    Field("payout_hold_days", "Payout hold (days)", NUMBER, hint="a sale's payout is held this long; empty: 0"),
    Field("active", "Active", CHECKBOX, hint="its leads are taken; untick to pause"),
    Field("routing", "Routing", SELECT, choices=ROUTING_MODES),
    Field("sell.max_sales", "Sales per lead", NUMBER, hint="shared buyers one lead may be sold to; empty: 1"),
    Field("mode", "Mode", SELECT, choices=MODES, hint="test: every lead is a test lead, nothing sold"),
    *(Field(f"caps.{cap}", f"Cap: {cap}", NUMBER) for cap in PUBLISHER_CAPS),
    Field("rate_limit.per_second", "Rate limit (leads/s)", NUMBER, hint="empty, with the burst: the default limit"),
    Field(
        "rate_limit.burst", "Rate limit burst", NUMBER, hint="leads at once above the rate; empty: one second's worth"
    ),
    Field("suppress", "Suppression lists", LIST, hint="list ids whose consumers' leads are refused, comma-separated"),
    Field("precheck.per_lead", "Pre-pings per lead", NUMBER, hint="pre-pings a day per lead posted; empty: 10"),
    Field("precheck.daily_floor", "Pre-pings a day", NUMBER, hint="pre-pings a day with no lead posted; empty: 1000"),
    Field(
        "fields",
        "Field spec",
        JSON,
        section="Advanced",
        hint='JSON: the lead fields it must send and their types, e.g. {"state": {"type": "enum", "values": ["TX"]}}',
    ),
)
NEW_FIELDS = (
    Field("id", "Id", required=True, hint="letters, digits, - and _; cannot change later"),
    *(
        Field("api_key", "API key", SECRET, hint="empty: one is made and shown once") if f.name == "api_key" else f
        for f in FIELDS
    ),
)


@bp.get("/ops/publishers", endpoint="publishers")
def publishers_list() -> ResponseReturnValue:
    rows, next_cursor = page_of(Publisher.select(), Publisher.id)
    return page(
        "publishers.html",
        SECTION,
        items=publisher_service.shown(services.current().store, rows),
        next_cursor=next_cursor,
    )


@bp.get("/ops/publishers/new")
def publisher_new() -> ResponseReturnValue:
    values = {"active": "on", "payout.type": "percent", "routing": "waterfall", "mode": "live"}
    return page("publisher_new.html", SECTION, fields=NEW_FIELDS, values=values, errors={})


@bp.post("/ops/publishers")
def publisher_create() -> ResponseReturnValue:
    """Create a publisher from the form: its page with the API key shown this once, or the
    form again with every refusal listed above it and each beside its field (400)."""
    reading = forms.read(NEW_FIELDS, request.form)
    publisher_id = str(reading.body.get("id") or "")
    api_key = reading.body.get("api_key") or new_key()
    body = {**{name: value for name, value in reading.body.items() if name != "id"}, "api_key": api_key}
    columns, errors = forms.checked(NEW_FIELDS, request.form, reading, lambda: publishers.parse(merge_patch({}, body)))
    if "id" not in errors and (problem := _id_problem(publisher_id)):
        errors["id"] = problem
    if columns is None or errors:
        values = forms.refilled(NEW_FIELDS, request.form)
        return page("publisher_new.html", SECTION, 400, fields=NEW_FIELDS, values=values, errors=errors)
    row = publisher_service.save(services.current().store, publisher_id, columns)
    return _publisher_page(row, None, {}, 201, api_key=api_key)


def _id_problem(publisher_id: str) -> str | None:
    if not is_id(publisher_id):
        return "must be 1 to 64 letters, digits, - or _"
    if Publisher.get_or_none(Publisher.id == publisher_id) is not None:
        return "is taken: open that publisher to edit it"
    return None


def new_key() -> str:
    return "pk_" + secrets.token_urlsafe(32)


@bp.get("/ops/publishers/<id:publisher_id>")
def publisher(publisher_id: str) -> ResponseReturnValue:
    return _publisher_page(publisher_service.existing(publisher_id), None, {}, 200)


def _publisher_page(
    row: Publisher, values: dict[str, str] | None, errors: dict[str, str], status: int, api_key: str | None = None
) -> ResponseReturnValue:
    shown = publisher_service.shown(services.current().store, [row])[0]
    today = datetime.now(timezone.utc).date()
    month_error = None
    try:
        statement = payout_statement.summary(
            row.id, payout_statement.month(request.args.get("month"), today), STATEMENT_LINES
        )
    except ValidationError as exc:  # a month it cannot show: this month's, and why not that one
        statement = payout_statement.summary(row.id, payout_statement.month(None, today), STATEMENT_LINES)
        month_error, status = str(exc), 400
    return page(
        "publisher.html",
        SECTION,
        status,
        publisher=shown,
        statement=statement,
        month_error=month_error,
        month_typed=request.args.get("month", "") if month_error else "",
        fields=FIELDS,
        values=forms.shown(FIELDS, shown) if values is None else values,
        errors=errors,
        api_key=api_key,
        audit=audit_rows("publisher", row.id),
    )


@bp.post("/ops/publishers/<id:publisher_id>")
def publisher_save(publisher_id: str) -> ResponseReturnValue:
    """Save the edit form as a merge patch (an empty API key field keeps the key): 303 to the
    page, or the page again (400) with every refusal, and nothing saved."""
    row = publisher_service.existing(publisher_id)
    current = publishers.to_json(row)
    reading = forms.read(FIELDS, request.form, current)
    changes = {name: value for name, value in reading.body.items() if name != "api_key" or value}
    columns, errors = forms.checked(FIELDS, request.form, reading, lambda: publisher_service.patched(row, changes))
    if columns is None or errors:
        return _publisher_page(row, forms.refilled(FIELDS, request.form, current), errors, 400)
    publisher_service.save(services.current().store, publisher_id, columns)
    return done("ops.publishers.publisher", "saved", publisher_id=publisher_id)


@bp.post("/ops/publishers/<id:publisher_id>/key")
def publisher_new_key(publisher_id: str) -> ResponseReturnValue:
    """A new API key, shown this once; the old one stops working at once."""
    api_key = new_key()
    row = publisher_service.patch(
        services.current().store, publisher_service.existing(publisher_id), {"api_key": api_key}
    )
    return _publisher_page(row, None, {}, 200, api_key=api_key)


@bp.post("/ops/publishers/<id:publisher_id>/pause")
def publisher_pause(publisher_id: str) -> ResponseReturnValue:
    publisher_service.patch(services.current().store, publisher_service.existing(publisher_id), {"active": False})
    return done("ops.publishers.publisher", "paused", publisher_id=publisher_id)


@bp.post("/ops/publishers/<id:publisher_id>/resume")
def publisher_resume(publisher_id: str) -> ResponseReturnValue:
    publisher_service.patch(services.current().store, publisher_service.existing(publisher_id), {"active": True})
    return done("ops.publishers.publisher", "resumed", publisher_id=publisher_id)


@bp.get("/ops/publishers/<id:publisher_id>/statement.csv")
def publisher_statement_csv(publisher_id: str) -> ResponseReturnValue:
    """The month's payout statement as CSV, as the admin API's (whose bearer token a browser
    under the console's cookie has not)."""
    period = payout_statement.month(request.args.get("month"), datetime.now(timezone.utc).date())
    publisher_id = payout_statement.publisher_id_of(publisher_id)
    return csv_response(payout_statement.as_csv(publisher_id, period), f"payouts-{publisher_id}-{period.label}.csv")
