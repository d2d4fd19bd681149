"""Admin routes that read wallets, payments and the payment events not yet delivered.

The customer is an e-mail address (it has an @), and payment references may hold characters
such as `|` (Monnify), so neither path part uses the strict `id` converter.
"""
from __future__ import annotations

from flask import jsonify, request

from webhooks.errors import NotFound, ValidationError
from webhooks.payments import outbox
from webhooks.payments.ledger import balances, payment_record
from webhooks.payments.signatures import VERIFIERS
from webhooks.storage.models import Payment
from webhooks.web.admin import bp


@bp.get("/wallets/<string:customer>")
def get_wallet(customer: str):
    customer = customer.strip().lower()
    found = balances(customer) if "@" in customer and len(customer) <= 254 else {}
    if not found:
        raise NotFound(f"no wallet for {customer!r}: never credited")
    return jsonify({"customer": customer, "balances_minor": found})


@bp.get("/payments/<id:provider>/<string:reference>")
def get_payment(provider: str, reference: str):
    row = None
    if provider in VERIFIERS and len(reference) <= 128:
        row = Payment.get_or_none(Payment.provider == provider, Payment.reference == reference)
    if row is None:
        raise NotFound(f"no {provider} payment {reference!r}")
    return jsonify(payment_record(row))


EVENT_STATUSES = {"pending": (outbox.PENDING,), "failed": (outbox.FAILED,), None: (outbox.PENDING, outbox.FAILED)}
MAX_EVENTS = 1000


@bp.get("/payment-events")
def list_payment_events():
    """What is not yet delivered to PAYMENT_EVENTS_URL, oldest first: `?status=pending` (still being
    retried, or held behind an earlier event of the same customer), `?status=failed` (given up:
    `flask --app wsgi events retry`), or both without `status`; `limit` (default 100)."""
    status = request.args.get("status")
    if status not in EVENT_STATUSES:
        raise ValidationError("invalid_query", "status", "must be pending or failed")
    raw_limit = request.args.get("limit", "100")
    if not raw_limit.isascii() or not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_EVENTS:
        raise ValidationError("invalid_query", "limit", f"must be an integer from 1 to {MAX_EVENTS}")
    return jsonify({"events": outbox.listing(EVENT_STATUSES[status], int(raw_limit)), "counts": outbox.counts()})
