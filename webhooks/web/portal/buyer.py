"""The buyer portal (`/portal/buyer`, docs/api.md "Portals"): a buyer user's own sales (search
by lead id, status and since; CSV), a return of one under its buyer's policy and feedback on
one (the buyer API's code paths: leads/accounting/buyer_sales.py, feedback.py), its balance,
statement and how to top up, and a new API key (shown once). Every route reads the buyer id
from the session's user only; a sale of another buyer is 404, the same answer as one that does
not exist (buyer_sales.own_sale)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from flask import Blueprint, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.billing import balance, statement
from webhooks.errors import Conflict, NotFound, ValidationError
from webhooks.formats.validate import instant
from webhooks.leads.accounting import buyer_sales, feedback
from webhooks.leads.accounting.search import BadCursor
from webhooks.leads.rules import buyer_keys
from webhooks.leads.rules.buyers import ReturnPolicy
from webhooks.people.accounts import Role, actor
from webhooks.storage.records.models import Buyer
from webhooks.web import sessions
from webhooks.web.http import csv_response

bp = Blueprint("buyer", __name__)
bp.before_request(lambda: sessions.require_portal(Role.BUYER))

PAGE = 50
CSV_PAGE = 500
CSV_COLUMNS = ("lead_id", "publisher_id", "price", "status", "sold_at", "returned_at", "return_reason", "return_id")
STATEMENT_LINES = 50
BAD_CURSOR = "cursor: is not a cursor of this list"
FEEDBACK_SENT = "Your feedback is recorded."
TOP_UP = (
    "Your leads are paid from a prepaid wallet. To top it up, pay by bank transfer or card to the "
    "account your account manager gave you, quoting your buyer id as the reference; the balance "
    "here rises once the payment is confirmed."
)


def _buyer_id() -> str:
    return str(g.portal_user.buyer_id)


def _query() -> buyer_sales.SaleQuery:
    """The search of the sales page and its CSV: `?lead_id=`, `?status=`, `?since=` (ISO 8601)."""
    status = request.args.get("status") or None
    if status is not None and status not in buyer_sales.STATUSES:
        raise ValidationError("invalid_query", "status", "must be one of " + ", ".join(buyer_sales.STATUSES))
    since_text = request.args.get("since") or None
    problem = "must be an ISO 8601 instant with an offset"
    since = instant("invalid_query", "since", since_text, problem=problem, offset_required=True) if since_text else None
    return buyer_sales.SaleQuery(
        buyer_id=_buyer_id(), status=status, since=since, lead_id=request.args.get("lead_id") or None
    )


@bp.get("/portal/buyer")
def home() -> ResponseReturnValue:
    """The buyer's balance, how to top up, and the API key form."""
    row = Buyer.get_or_none(Buyer.id == _buyer_id(), Buyer.deleted_at.is_null())
    if row is None:
        raise NotFound("no such page")
    billing = balance.Billing.from_json(row.billing)
    shown = balance.shown(services.current().store, row.id, billing) if billing is not None else None
    return render_template("portal_buyer.html", buyer_id=row.id, balance=shown, top_up=TOP_UP, api_key=None)


@bp.post("/portal/buyer/key")
def rotate_key() -> ResponseReturnValue:
    """A new API key for the buyer, replacing the old one, shown on this answer only."""
    key = buyer_keys.issue(_buyer_id(), actor=actor(g.portal_user))
    html = render_template("portal_buyer.html", buyer_id=_buyer_id(), balance=None, top_up=TOP_UP, api_key=key)
    return html, 200


@bp.get("/portal/buyer/sales")
def sales() -> ResponseReturnValue:
    """The search; a field it refuses is said above the form, as typed (400)."""
    shown = {"args": request.args, "statuses": buyer_sales.STATUSES}
    try:
        page = buyer_sales.page(_query(), limit=PAGE, cursor=request.args.get("cursor") or None)
    except BadCursor:
        return render_template("portal_sales.html", items=[], next_cursor=None, error=BAD_CURSOR, **shown), 400
    except ValidationError as exc:
        return render_template("portal_sales.html", items=[], next_cursor=None, error=str(exc), **shown), 400
    return render_template("portal_sales.html", items=page.items, next_cursor=page.next_cursor, **shown)


@bp.get("/portal/buyer/sales.csv")
def sales_csv() -> ResponseReturnValue:
    query = _query()
    return csv_response(_csv(query), f"sales-{_buyer_id()}.csv")


def _csv(query: buyer_sales.SaleQuery) -> Iterator[str]:
    yield statement.csv_rows([CSV_COLUMNS])
    cursor = None
    while True:
        page = buyer_sales.page(query, limit=CSV_PAGE, cursor=cursor)
        yield statement.csv_rows([item[c] for c in CSV_COLUMNS] for item in page.items)
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


@bp.get("/portal/buyer/sales/<publisher_id>/<lead_id>")
def sale(publisher_id: str, lead_id: str) -> ResponseReturnValue:
    """The sale's page (saying so after feedback was sent: `?notice=feedback`)."""
    sent = FEEDBACK_SENT if request.args.get("notice") == "feedback" else None
    return _sale_page(publisher_id, lead_id, sent, 200)


def _sale_page(publisher_id: str, lead_id: str, message: str | None, status: int) -> ResponseReturnValue:
    """The sale's page; `message` says what came of a form (an error when `status` is 4xx)."""
    own = buyer_sales.own_sale(_buyer_id(), publisher_id, lead_id)  # 404 unless the buyer's
    shown = buyer_sales.view(own, None)
    given = feedback.of_sales([own.id]).get(own.id, [])
    row = Buyer.get_or_none(Buyer.id == _buyer_id())
    reasons = ReturnPolicy.of(row).reasons if row is not None else None
    html = render_template(
        "portal_sale.html",
        sale=shown,
        feedback=given,
        message=message,
        failed=status >= 400,
        reasons=reasons,
        events=feedback.EVENTS,
    )
    return html, status


@bp.post("/portal/buyer/sales/<publisher_id>/<lead_id>/return")
def return_sale(publisher_id: str, lead_id: str) -> ResponseReturnValue:
    """Return the sale under the buyer's policy (the buyer API's code path): the sale's page
    again, saying what came of it; 404 unless the sale is the buyer's."""
    reason = request.form.get("reason") or None
    svc = services.current()
    try:
        done = buyer_sales.return_own(
            svc.store,
            queue_redis=svc.queue_redis,
            queue=svc.queue,
            buyer_id=_buyer_id(),
            publisher_id=publisher_id,
            lead_id=lead_id,
            reason=reason,
            actor=actor(g.portal_user),
        )
    except (ValidationError, Conflict) as exc:
        return _sale_page(publisher_id, lead_id, str(exc), 409 if isinstance(exc, Conflict) else 400)
    message = "Your return awaits review." if done.pending else "Returned."
    return _sale_page(publisher_id, lead_id, message, 200)


@bp.post("/portal/buyer/sales/<publisher_id>/<lead_id>/feedback")
def send_feedback(publisher_id: str, lead_id: str) -> ResponseReturnValue:
    """Feedback on the sale (feedback.py, the buyer API's), under the form's `id`."""
    body: dict[str, Any] = {
        "id": request.form.get("id", ""),
        "lead_id": lead_id,
        "publisher_id": publisher_id,
        "event": request.form.get("event", ""),
        "value": request.form.get("value", ""),
    }
    own = buyer_sales.own_sale(_buyer_id(), publisher_id, lead_id)  # 404 before any 400
    try:
        feedback.record(own, feedback.parse(body))
    except (ValidationError, Conflict) as exc:
        return _sale_page(publisher_id, lead_id, str(exc), 409 if isinstance(exc, Conflict) else 400)
    return redirect(
        url_for("portal.buyer.sale", publisher_id=publisher_id, lead_id=lead_id, notice="feedback"), code=303
    )


def _period() -> statement.Month:
    today = datetime.now(timezone.utc).date()
    return statement.month(request.args.get("month") or today.strftime("%Y-%m"), today)


@bp.get("/portal/buyer/statement")
def buyer_statement() -> ResponseReturnValue:
    """The month's figures and its last lines (`?month=YYYY-MM`, this month by default)."""
    period = _period()
    try:
        wallet = statement.billed_wallet(_buyer_id())
    except Conflict:
        return render_template("portal_statement.html", summary=None, month=period.label)
    return render_template(
        "portal_statement.html", summary=statement.summary(wallet, period, STATEMENT_LINES), month=period.label
    )


@bp.get("/portal/buyer/statement.csv")
def statement_csv() -> ResponseReturnValue:
    period = _period()
    wallet = statement.billed_wallet(_buyer_id())
    return csv_response(statement.as_csv(wallet, period), f"statement-{_buyer_id()}-{period.label}.csv")
