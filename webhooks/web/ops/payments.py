"""The console's payments: the verified payments that named no wallet, each with a form that
assigns it to one (exactly once, as POST /v1/admin/payments/.../assign); every payment of the
ledger, newest first, searched by provider, currency, wallet, status and days received, a page
at a time or all of it as CSV; a wallet's balance, payments and journal; and the payment
events not yet delivered to the application."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import Any

from flask import Blueprint, request, url_for
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import BadRequest, Conflict, ValidationError
from webhooks.events import log as events_log
from webhooks.formats import money, validate
from webhooks.leads.accounting.search import BadCursor, encode_cursor, time_key
from webhooks.payments import ledger, search
from webhooks.payments.ledger import payment_record
from webhooks.payments.providers.notifications import wallet
from webhooks.payments.providers.signatures import VERIFIERS
from webhooks.payments.states import PaymentStatus
from webhooks.payments.webhook import find
from webhooks.web.http import csv_response
from webhooks.web.ops.console import audit_rows, done, page, refusal

bp = Blueprint("payments", __name__)

SECTION = "ops.payments.payments"
SHOWN = 200  # unattributed payments on the page, oldest first
PAGE = 50  # payments of the search per page
WALLET_SHOWN = 100  # a wallet's newest payments and journal moves
FILTERS = ("provider", "currency", "account", "status", "from", "to")
QUERY = "invalid_query"


def _filters() -> tuple[dict[str, str], search.PaymentQuery, dict[str, str]]:
    """The search's filters as typed, as a query, and what is wrong with each (every one)."""
    typed = _typed(FILTERS)
    values, errors = _read(
        typed,
        {
            "provider": _provider,
            "currency": _currency,
            "account": _account,
            "status": _status,
            "from": lambda raw: validate.day(QUERY, "from", raw),
            "to": lambda raw: validate.day(QUERY, "to", raw),
        },
    )
    first, last = values.get("from"), values.get("to")
    if first is not None and last is not None and last < first:
        errors["to"] = "must be on or after from"
    query = search.PaymentQuery(
        provider=values.get("provider"),
        currency=values.get("currency"),
        customer=values.get("account"),
        status=values.get("status"),
        since=None if first is None else datetime(first.year, first.month, first.day),
        until=None if last is None or last == date.max else datetime(last.year, last.month, last.day) + timedelta(1),
    )
    return typed, query, errors


def _typed(names: tuple[str, ...]) -> dict[str, str]:
    """The query string's fields as typed (bounded: a filter is never long)."""
    return {name: request.args.get(name, "").strip()[:300] for name in names}


def _read(typed: dict[str, str], readers: dict[str, Callable[[str], Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """Each field typed, read by its reader: (values, what is wrong with each field refused)."""
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, read in readers.items():
        if typed[name]:
            try:
                values[name] = read(typed[name])
            except ValidationError as exc:
                errors[name] = refusal(exc)
    return values, errors


def _provider(raw: str) -> str:
    if raw not in VERIFIERS:
        raise ValidationError(QUERY, "provider", "must be one of " + ", ".join(VERIFIERS))
    return raw


def _currency(raw: str) -> str:
    code = raw.upper()
    if code not in money.CURRENCIES:
        raise ValidationError(QUERY, "currency", "must be an ISO 4217 code such as USD or NGN")
    return code


def _account(raw: str) -> str:
    key = wallet(raw)  # as a payment names its wallet: an e-mail lower-cased, an account id as it is
    if key is None:
        raise ValidationError(QUERY, "account", "must be a wallet: an e-mail or an account id, without spaces")
    return key


def _status(raw: str) -> str:
    if raw not in {s.value for s in PaymentStatus}:
        raise ValidationError(QUERY, "status", "must be one of " + ", ".join(s.value for s in PaymentStatus))
    return raw


def _payments_page(status: int = 200, error: tuple[str, str] | None = None) -> ResponseReturnValue:
    """The page; `error` (payment key, message) shown on that unattributed payment's row."""
    found = [
        {**payment_record(p), "amount": money.text(p.amount_minor, p.currency), "key": f"{p.provider}:{p.reference}"}
        for p in ledger.unattributed(SHOWN)
    ]
    configured = bool(services.current().config.payment_events_url)
    typed, query, errors = _filters()
    listed: list[dict[str, Any]] = []
    next_url = None
    if not errors:
        try:
            after = time_key(request.args["cursor"]) if request.args.get("cursor") else None
        except BadCursor:
            errors["cursor"] = "must be the link of the page before"
        else:
            rows, last = search.page(query, limit=PAGE, after=after)
            listed = [search.shown(p) for p in rows]
            if last is not None:
                cursor = encode_cursor([last[0].isoformat(), last[1]])
                next_url = url_for(SECTION, **_set(typed), cursor=cursor)
    return page(
        "payments.html",
        SECTION,
        400 if errors else status,
        payments=found,
        error=error,
        counts=events_log.payment_event_counts(configured),
        audit=audit_rows("payment", limit=20),
        filters=typed,
        filter_errors=errors,
        providers=list(VERIFIERS),
        statuses=[s.value for s in PaymentStatus],
        listed=listed,
        next_url=next_url,
        csv_url=url_for("ops.payments.payments_csv", **_set(typed)),
    )


def _set(typed: dict[str, str]) -> dict[str, Any]:
    return {name: value for name, value in typed.items() if value}


@bp.get("/ops/payments")
def payments() -> ResponseReturnValue:
    return _payments_page()


@bp.get("/ops/payments.csv")
def payments_csv() -> ResponseReturnValue:
    """Every payment the page's filters match, as CSV, streamed a page of rows at a time."""
    _typed, query, errors = _filters()
    if errors:
        name, problem = next(iter(errors.items()))
        raise ValidationError(QUERY, name, problem)
    return csv_response(search.csv_lines(query), "payments.csv")


@bp.get("/ops/payments/wallet")
def wallet_lookup() -> ResponseReturnValue:
    """A wallet (`account`, and `currency` or every currency it holds) as the ledger holds it:
    its balance, its newest payments and the moves of its journal (top-ups, sales, returns,
    refunds, disputes)."""
    typed = _typed(("account", "currency"))
    values, errors = _read(typed, {"account": _account, "currency": _currency})
    if not typed["account"] and (typed["currency"] or "account" in request.args):
        errors["account"] = "is required"
    view = None
    if "account" in values and not errors:
        view = search.wallet(values["account"], values.get("currency"), WALLET_SHOWN)
    return page(
        "wallet.html",
        SECTION,
        400 if errors else 200,
        typed=typed,
        errors=errors,
        view=view,
        balances=[] if view is None else [(c, money.text(m, c)) for c, m in view.balances.items()],
        payments=[] if view is None else [search.shown(p) for p in view.payments],
        moves=[] if view is None else [_move(m) for m in view.moves],
        shown=WALLET_SHOWN,
    )


def _move(entry: Any) -> dict[str, str]:
    return {
        "at": entry.at.isoformat(sep=" ", timespec="seconds"),
        "kind": entry.kind,
        "currency": entry.currency,
        "amount": money.text(entry.amount_minor, entry.currency),
        "debit": "true" if entry.amount_minor < 0 else "false",
        "reference": entry.reference,
    }


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
