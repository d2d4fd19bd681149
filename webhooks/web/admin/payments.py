"""Admin routes that read wallets, payments, the payment events not yet delivered and the
webhooks refused for their signature.

The customer is a wallet (an e-mail address, or the merchant's account id: events.wallet), and
payment references may hold characters such as `|` (Monnify), so neither path part uses the
strict `id` converter.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import NotFound, ValidationError
from webhooks.events import log as events_log
from webhooks.formats import validate
from webhooks.payments import ledger, rejected
from webhooks.payments.ledger import balances, payment_record
from webhooks.payments.providers.notifications import wallet
from webhooks.payments.providers.signatures import VERIFIERS
from webhooks.payments.webhook import find
from webhooks.storage.records.models import utcnow
from webhooks.web.http import json_body, query_arg

bp = Blueprint("payments", __name__)


@bp.get("/wallets/<string:customer>")
def get_wallet(customer: str) -> ResponseReturnValue:
    key = wallet(customer)
    found = balances(key) if key is not None else {}
    if not found:
        raise NotFound(f"no wallet for {customer.strip().lower() if key is None else key!r}: never credited")
    return jsonify({"customer": key, "balances_minor": found})


@bp.get("/payments/<id:provider>/<string:reference>")
def get_payment(provider: str, reference: str) -> ResponseReturnValue:
    return jsonify(payment_record(find(provider, reference)))


PAYMENT_STATUSES = ("unattributed",)


@bp.get("/payments")
def list_payments() -> ResponseReturnValue:
    """`?status=unattributed`: the verified payments that named no wallet, oldest first, for
    an operator to assign; `limit` (default 100, at most 1000)."""
    status = query_arg("status")
    if status not in PAYMENT_STATUSES:
        raise ValidationError("invalid_query", "status", "must be unattributed")
    found = ledger.unattributed(_limit(MAX_EVENTS))
    return jsonify({"payments": [payment_record(p) for p in found], "count": len(found)})


@bp.post("/payments/<id:provider>/<string:reference>/assign")
def assign_payment(provider: str, reference: str) -> ResponseReturnValue:
    """Credit an unattributed payment to `{"customer": "<wallet>"}`, exactly once: 200 the
    payment's record; 409 already_assigned for a payment that is not unattributed."""
    find(provider, reference)  # 404 first, before the body is looked at
    body = json_body()
    customer = body.get("customer") if isinstance(body, dict) else None
    return jsonify(payment_record(services.current().payments.assign(provider, reference, customer)))


EVENT_STATUSES = {"pending": ("pending",), "failed": ("failed",), None: ("pending", "failed")}
MAX_EVENTS = 1000


@bp.get("/payment-events")
def list_payment_events() -> ResponseReturnValue:
    """What is not yet delivered to PAYMENT_EVENTS_URL, oldest first: `?status=pending` (still being
    retried, or held behind an earlier event of the same customer), `?status=failed` (given up:
    `flask --app wsgi events retry`), or both without `status`; `limit` (default 100)."""
    status = query_arg("status")
    if status not in EVENT_STATUSES:
        raise ValidationError("invalid_query", "status", "must be pending or failed")
    limit = _limit(MAX_EVENTS)
    configured = bool(services.current().config.payment_events_url)
    return jsonify(
        {
            "events": events_log.payment_events(EVENT_STATUSES[status], limit, configured),
            "counts": events_log.payment_event_counts(configured),
        }
    )


def _limit(most: int) -> int:
    """`?limit=`: an integer from 1 to `most`, 100 when absent (400 invalid_query otherwise)."""
    raw = query_arg("limit") or "100"
    if not raw.isascii() or not raw.isdigit() or len(raw) > 6 or not 1 <= int(raw) <= most:
        raise ValidationError("invalid_query", "limit", f"must be an integer from 1 to {most}")
    return int(raw)


@bp.get("/webhooks/rejected")
def list_rejected_webhooks() -> ResponseReturnValue:
    """The payment webhooks refused for their signature, newest first, from the capped Redis
    list (never the database): `?provider=` to see one provider's, `limit` (default 100, at
    most 1000). `count` is the list's length, every provider's."""
    provider = query_arg("provider")
    if provider is not None and provider not in VERIFIERS:
        raise ValidationError("invalid_query", "provider", "must be one of " + ", ".join(VERIFIERS))
    found = rejected.listing(services.current().store.redis, provider, _limit(rejected.KEEP))
    return jsonify({"rejected": [asdict(e) for e in found.entries], "count": found.count})


@bp.get("/webhooks/ignored")
def count_ignored_webhooks() -> ResponseReturnValue:
    """The verified payment webhooks answered `ignored` since `?since=` (default: the last 24
    hours), counted per provider, event type and reason; `?provider=` for one provider's."""
    provider = query_arg("provider")
    if provider is not None and provider not in VERIFIERS:
        raise ValidationError("invalid_query", "provider", "must be one of " + ", ".join(VERIFIERS))
    raw = query_arg("since")
    since = utcnow() - timedelta(days=1) if raw is None else validate.since(raw, "invalid_query")
    counts = ledger.ignored_counts(provider, since)
    return jsonify({"since": since.isoformat() + "Z", "ignored": counts, "total": sum(c["count"] for c in counts)})
