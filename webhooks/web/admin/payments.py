"""Admin routes that read wallets and payments.

The customer is an e-mail address (it has an @), and payment references may hold characters
such as `|` (Monnify), so neither path part uses the strict `id` converter.
"""
from __future__ import annotations

from flask import jsonify

from webhooks.errors import NotFound
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
