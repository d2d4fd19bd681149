"""The console's buyers: the list (pause or resume those selected), the form that creates one,
and each buyer's page (edit, pause and resume, cap use, its figures as the report has them,
balance and statement, a test lead, its audit log). Every change goes through the admin API's
own service (leads/rules/buyer_service.py), so the console can do nothing the API would
refuse, and leaves the same audit rows."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.billing import balance, statement
from webhooks.caps.windows import COUNT_CAPS
from webhooks.errors import BadRequest, ValidationError
from webhooks.formats import strictjson
from webhooks.formats.consumer import FIELDS as DEDUPE_FIELDS
from webhooks.formats.validate import is_id, merge_patch
from webhooks.leads.path import preview
from webhooks.leads.rules import buyer_service, buyers, consent
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage.records import audit
from webhooks.storage.records.models import Buyer
from webhooks.web.http import csv_response
from webhooks.web.listing import page_of
from webhooks.web.ops import forms
from webhooks.web.ops.console import audit_rows, done, page
from webhooks.web.ops.forms import CHECKBOX, CHOICES, HEADERS, HOURS, JSON, LIST, NUMBER, SELECT, Field
from webhooks.web.ops.page import billing_panels, buyer_figures

bp = Blueprint("buyers", __name__)

SECTION = "ops.buyers.buyers"
STATEMENT_LINES = 100  # the month's last lines shown; the CSV has them all
SELECTED_MAX = 500  # buyers one pause or resume of the list may name (a page holds at most 500)
TEST_LEAD_MAX = 8 * 1024  # bytes of a test lead's JSON
SAMPLE_LEAD = json.dumps(preview.SAMPLE_LEAD, indent=2)

HOURS_HINT = "local times, e.g. 09:00-17:00 or 09:00-12:00, 13:00-17:00; empty: closed; every day empty: always open"
DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
FIELDS = (
    Field("name", "Name", required=True),
    Field("endpoint_url", "Endpoint URL", required=True, hint="where leads are posted; shown without its credentials"),
    Field("price", "Price", required=True, hint="paid per lead, e.g. 12.50"),
    Field("priority", "Priority", NUMBER, hint="lower is offered first (0 when empty)"),
    Field("weight", "Weight", NUMBER, hint="share among buyers of one priority under weighted routing"),
    Field("contract", "Contract", SELECT, choices=buyers.CONTRACTS, hint="shared: buys a lead beside others"),
    Field("timezone", "Time zone", hint="IANA name for its caps' days and schedule (UTC when empty)"),
    Field("active", "Active", CHECKBOX, hint="offered leads; untick to pause"),
    *(
        Field(f"caps.{cap}", f"Cap: {cap}", NUMBER, section="Caps" if i == 0 else "")
        for i, cap in enumerate(COUNT_CAPS)
    ),
    Field("caps.daily_budget", "Cap: daily budget", hint="money a day, e.g. 500.00"),
    Field(
        "states",
        "States",
        LIST,
        section="Which leads",
        hint="US state codes the lead's state must be one of, e.g. TX, OK (comma-separated); empty: any",
    ),
    Field("blocked_publishers", "Blocked publishers", LIST, hint="publisher ids, comma-separated"),
    Field("suppress", "Suppression lists", LIST, hint="list ids whose consumers it is never offered, comma-separated"),
    Field("require_consent", "Require consent", CHOICES, choices=consent.KINDS, hint="none ticked: none required"),
    Field("filter", "Filter", hint="a JMESPath expression on the lead; empty: none"),
    *(
        Field(
            f"schedule.{day}",
            name,
            HOURS,
            section="Opening hours" if day == "mon" else "",
            hint=HOURS_HINT if day == "mon" else "",
        )
        for day, name in zip(buyers.DAYS, DAY_NAMES, strict=True)
    ),
    Field(
        "dedupe.fields",
        "Dedupe by",
        CHOICES,
        choices=DEDUPE_FIELDS,
        clears=True,
        section="Dedupe",
        hint="a consumer it bought by one of these is not offered to it again; none ticked: no dedupe",
    ),
    Field("dedupe.days", "Dedupe for (days)", NUMBER, hint="1 to 365; 30 when empty"),
    Field("returns.window_days", "Return window (days)", NUMBER, section="Returns", hint="7 when empty"),
    Field("returns.max_pct", "Return limit (%)", NUMBER, hint="returns per 100 sales of the period; empty: no limit"),
    Field("returns.period_days", "Return limit period (days)", NUMBER, hint="14 when empty"),
    Field("returns.reasons", "Return reasons", LIST, hint="codes a return must give, comma-separated; empty: any"),
    Field(
        "returns.review",
        "Return review",
        SELECT,
        choices=buyers.REVIEWS,
        hint="manual: each return waits on /ops/returns",
    ),
    Field(
        "billing.mode",
        "Billing",
        SELECT,
        choices=(balance.PREPAID, balance.CREDIT),
        blank="not billed",
        clears=True,
        section="Billing",
        hint="prepaid: leads while its balance lasts; credit: down to its credit limit",
    ),
    Field("billing.account", "Wallet account", hint="the account its payments name, e.g. buyer-acme"),
    Field("billing.currency", "Currency", hint="ISO 4217, e.g. USD; the price must be a whole amount of it"),
    Field("billing.credit_limit", "Credit limit", hint="credit billing only, e.g. 2500.00"),
    Field("billing.low_balance", "Low-balance alert", hint="an event when available falls below it; empty: none"),
    Field(
        "delivery.method",
        "Method",
        SELECT,
        choices=("POST", "PUT"),
        blank="POST (default)",
        section="Delivery",
    ),
    Field(
        "delivery.format",
        "Content type",
        SELECT,
        choices=("json", "form"),
        blank="json (default)",
        hint="json: application/json; form: application/x-www-form-urlencoded",
    ),
    Field(
        "delivery.headers",
        "Headers",
        HEADERS,
        hint="one a line, Name: value, e.g. X-Api-Key: sk_live_...; a value shown as ****1234 is kept",
    ),
    Field("delivery.accept", "Accepted when", hint="JMESPath on the reply's JSON; empty: accepted == `true`"),
    Field("delivery.accept_regex", "Accepted when (regex)", hint="instead of the above, for a reply that is not JSON"),
    Field(
        "ping.url",
        "Ping URL",
        clears=True,
        section="Ping/post",
        hint="pinged for a bid before the post; empty: no ping",
    ),
    Field("ping.bid", "Bid", hint="JMESPath to the price in the ping's reply, e.g. price"),
    Field("ping.min_bid", "Minimum bid", hint="a lower bid does not take part, e.g. 3.00; empty: 0.00"),
    Field(
        "delivery.fields",
        "Post fields",
        JSON,
        section="Advanced",
        hint='JSON: output name to template, e.g. {"email": "{{ lead.email }}"}; empty: the default body',
    ),
    Field("ping.fields", "Ping fields", JSON, hint='JSON: the ping\'s fields, e.g. {"state": "{{ lead.state }}"}'),
)
NEW_FIELDS = (Field("id", "Id", required=True, hint="letters, digits, - and _; cannot change later"), *FIELDS)


@bp.get("/ops/buyers", endpoint="buyers")
def buyers_list() -> ResponseReturnValue:
    """Buyers not deleted, by id, a page at a time."""
    return _list_page(None)


def _list_page(changed: dict[str, Any] | None, error: str | None = None) -> ResponseReturnValue:
    """The list; after a pause or resume of those selected, what it changed (or why nothing: 400)."""
    select = Buyer.select().where(Buyer.deleted_at.is_null())
    rows, next_cursor = page_of(select, Buyer.id)
    items = buyer_service.shown(services.current().store, rows)
    status = 400 if error else 200
    context = {"changed": changed, "error": error, "selected_max": SELECTED_MAX}
    return page("buyers.html", SECTION, status, items=items, next_cursor=next_cursor, **context)


@bp.get("/ops/buyers/new")
def buyer_new() -> ResponseReturnValue:
    return page("buyer_new.html", SECTION, fields=NEW_FIELDS, values={"active": "on", "timezone": "UTC"}, errors={})


@bp.post("/ops/buyers")
def buyer_create() -> ResponseReturnValue:
    """Create a buyer from the form: 303 to its page, or the form again with every refusal
    listed above it and each beside its field (400). An id in use is refused: this form never
    replaces a buyer."""
    reading = forms.read(NEW_FIELDS, request.form)
    buyer_id = str(reading.body.get("id") or "")
    body = {name: value for name, value in reading.body.items() if name != "id"}
    columns, errors = forms.checked(NEW_FIELDS, request.form, reading, lambda: buyers.parse(merge_patch({}, body)))
    if "id" not in errors and (problem := _id_problem(buyer_id)):
        errors["id"] = problem
    if columns is not None and not errors:
        try:
            buyer_service.save(services.current().store, buyer_id, columns)
            return done("ops.buyers.buyer", "created", buyer_id=buyer_id)
        except BadRequest as exc:  # the wallet's other buyers refuse its billing
            errors = forms.refusals(NEW_FIELDS, request.form, reading, exc)
    values = forms.refilled(NEW_FIELDS, request.form)
    return page("buyer_new.html", SECTION, 400, fields=NEW_FIELDS, values=values, errors=errors)


def _id_problem(buyer_id: str) -> str | None:
    if not is_id(buyer_id):
        return "must be 1 to 64 letters, digits, - or _"
    if Buyer.get_or_none(Buyer.id == buyer_id) is not None:
        return "is taken: open that buyer to edit it"
    return None


@bp.get("/ops/buyers/<id:buyer_id>")
def buyer(buyer_id: str) -> ResponseReturnValue:
    row = buyer_service.live(buyer_id)
    return _buyer_page(row, forms.shown(FIELDS, buyers.to_json(row)), {}, 200)


def _buyer_page(
    row: Buyer, values: dict[str, str], errors: dict[str, str], status: int, test: dict[str, Any] | None = None
) -> ResponseReturnValue:
    shown = buyer_service.shown(services.current().store, [row])[0]
    billing = billing_panels([row]).get(row.id)
    statement_shown, month_error = None, None
    if billing:
        try:
            statement_shown = _statement(row.id, _month())
        except ValidationError as exc:  # a month it cannot show: this month's, and why not that one
            statement_shown, month_error, status = _statement(row.id, _this_month()), str(exc), 400
    return page(
        "buyer.html",
        SECTION,
        status,
        buyer=shown,
        billing=billing,
        statement=statement_shown,
        month_error=month_error,
        month_typed=request.args.get("month", "") if month_error else "",
        fields=FIELDS,
        values=values,
        errors=errors,
        audit=audit_rows("buyer", row.id),
        figures=buyer_figures(row.id, datetime.now(timezone.utc)),
        test=test or {"lead": SAMPLE_LEAD, "sent": None, "error": None},
    )


def _statement(buyer_id: str, month: str) -> dict[str, Any]:
    """The month's figures and its last lines (400 invalid_query for a month it cannot show)."""
    period = statement.month(month, datetime.now(timezone.utc).date())
    wallet = statement.billed_wallet(buyer_id)
    return statement.summary(wallet, period, STATEMENT_LINES)


def _month() -> str:
    """`?month=`, this month when absent or empty."""
    return request.args.get("month") or _this_month()


def _this_month() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m")


@bp.post("/ops/buyers/<id:buyer_id>")
def buyer_save(buyer_id: str) -> ResponseReturnValue:
    """Save the edit form as a merge patch: 303 to the page, or the page again (400) with every
    refusal listed and each beside its field, and nothing saved."""
    row = buyer_service.live(buyer_id)
    current = buyers.to_json(row)
    reading = forms.read(FIELDS, request.form, current)
    columns, errors = forms.checked(FIELDS, request.form, reading, lambda: buyer_service.patched(row, reading.body))
    if columns is not None and not errors:
        try:
            buyer_service.save(services.current().store, buyer_id, columns)
            return done("ops.buyers.buyer", "saved", buyer_id=buyer_id)
        except BadRequest as exc:  # the wallet's other buyers refuse its billing
            errors = forms.refusals(FIELDS, request.form, reading, exc)
    return _buyer_page(row, forms.refilled(FIELDS, request.form, current), errors, 400)


@bp.post("/ops/buyers/<id:buyer_id>/pause")
def buyer_pause(buyer_id: str) -> ResponseReturnValue:
    buyer_service.set_active(services.current().store, [buyer_service.live(buyer_id)], active=False)
    return done("ops.buyers.buyer", "paused", buyer_id=buyer_id)


@bp.post("/ops/buyers/<id:buyer_id>/resume")
def buyer_resume(buyer_id: str) -> ResponseReturnValue:
    buyer_service.set_active(services.current().store, [buyer_service.live(buyer_id)], active=True)
    return done("ops.buyers.buyer", "resumed", buyer_id=buyer_id)


@bp.get("/ops/buyers/<id:buyer_id>/statement.csv")
def buyer_statement_csv(buyer_id: str) -> ResponseReturnValue:
    """The month's statement as CSV, as the admin API's (whose bearer token a browser under
    the console's cookie has not)."""
    period = statement.month(_month(), datetime.now(timezone.utc).date())
    wallet = statement.billed_wallet(buyer_id)
    return csv_response(statement.as_csv(wallet, period), f"statement-{buyer_id}-{period.label}.csv")


@bp.post("/ops/buyers/<id:buyer_id>/test-lead")
def buyer_test_lead(buyer_id: str) -> ResponseReturnValue:
    """Send a test lead (the form's JSON, the sample when empty) to the buyer, and show the
    page with how it went (leads/path/preview.py `send_test`: nothing reserved or sold); the
    sending is audited. A lead that is no JSON object of TEST_LEAD_MAX bytes: 400, beside it."""
    row = buyer_service.live(buyer_id)
    typed = request.form.get("lead", "")
    try:
        raw = (typed.strip() or SAMPLE_LEAD).encode()
        if len(raw) > TEST_LEAD_MAX:
            raise ValidationError("invalid_lead", "lead", f"must be at most {TEST_LEAD_MAX} bytes of JSON")
        sent = preview.send_test(services.current().intake.router, BuyerRule.from_row(row), strictjson.loads(raw))
    except BadRequest as exc:
        refused = {"lead": typed[:TEST_LEAD_MAX], "sent": None, "error": str(exc)}
        return _buyer_page(row, forms.shown(FIELDS, buyers.to_json(row)), {}, 400, refused)
    audit.record(audit.ADMIN, "buyer.test_lead", "buyer", buyer_id, sent.audited())
    test: dict[str, Any] = {"lead": typed or SAMPLE_LEAD, "sent": sent, "error": None}
    return _buyer_page(row, forms.shown(FIELDS, buyers.to_json(row)), {}, 200, test)


@bp.post("/ops/selected-buyers")
def buyers_selected() -> ResponseReturnValue:
    """Pause or resume (`action`) the buyers ticked on the list (`buyer_id`, at most
    SELECTED_MAX): one transaction through buyer_service, an audit row for each as its own
    pause would leave. The list again, saying which were changed and which no longer exist."""
    action = request.form.get("action")
    wanted = list(dict.fromkeys(request.form.getlist("buyer_id")))
    if action not in ("pause", "resume"):
        return _list_page(None, "Choose Pause selected or Resume selected.")
    if not wanted or len(wanted) > SELECTED_MAX or not all(is_id(buyer_id) for buyer_id in wanted):
        return _list_page(None, f"Tick 1 to {SELECTED_MAX} buyers of the list: nothing was changed.")
    rows = list(Buyer.select().where(Buyer.id.in_(wanted), Buyer.deleted_at.is_null()).order_by(Buyer.id))
    changed = buyer_service.set_active(services.current().store, rows, active=action == "resume") if rows else []
    found = {row.id for row in changed}
    return _list_page({"action": action, "done": sorted(found), "missing": [b for b in wanted if b not in found]})
