"""The console's payments: the verified payments that named no wallet, each with a form that
assigns it to one (exactly once, as POST /v1/admin/payments/.../assign), and the payment
events not yet delivered to the application."""

from __future__ import annotations

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import BadRequest, Conflict
from webhooks.events import log as events_log
from webhooks.formats import money
from webhooks.payments import ledger
from webhooks.payments.ledger import payment_record
from webhooks.payments.webhook import find
from webhooks.web.ops.console import audit_rows, done, page

bp = Blueprint("payments", __name__)

SECTION = "ops.payments.payments"
SHOWN = 200  # unattributed payments on the page, oldest first


def _payments_page(status: int = 200, error: tuple[str, str] | None = None) -> ResponseReturnValue:
    """The page; `error` (payment key, message) shown on that payment's row."""
    found = [
        {**payment_record(p), "amount": money.text(p.amount_minor, p.currency), "key": f"{p.provider}:{p.reference}"}
        for p in ledger.unattributed(SHOWN)
    ]
    configured = bool(services.current().config.payment_events_url)
    return page(
        "payments.html",
        SECTION,
        status,
        payments=found,
        error=error,
        counts=events_log.payment_event_counts(configured),
        audit=audit_rows("payment", limit=20),
    )


@bp.get("/ops/payments")
def payments() -> ResponseReturnValue:
    return _payments_page()


@bp.post("/ops/payments/<id:provider>/<string:reference>/assign")
def payment_assign(provider: str, reference: str) -> ResponseReturnValue:
    """Assign the payment to the form's `customer` wallet: 303 back with a notice, or the page
    again with why not beside the payment (400, or 409 when it was assigned meanwhile)."""
    find(provider, reference)  # 404 for no such payment
    try:
        services.current().payments.assign(provider, reference, request.form.get("customer", "").strip())
    except (BadRequest, Conflict) as exc:
        return _payments_page(exc.status, (f"{provider}:{reference}", str(exc)))
    return done("ops.payments.payments", "assigned")
