"""The states of the payment path as enums (their values are what the database and the API
hold): a webhook's verdict, and a payment's status."""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """What became of one verified webhook: its answer's `status` (or error code) and the
    `verdict` of its webhook_deliveries row (docs/payments.md, "Audit trail")."""

    CREDITED = "credited"
    UNATTRIBUTED = "unattributed"
    DEBITED = "debited"
    DUPLICATE = "duplicate"
    IN_FLIGHT = "in_flight"
    IGNORED = "ignored"
    INVALID_PAYLOAD = "invalid_payload"
    INVALID_JSON = "invalid_json"
    REFERENCE_CONFLICT = "reference_conflict"
    PAYMENT_NOT_FOUND = "payment_not_found"
    REFUND_EXCEEDS_PAYMENT = "refund_exceeds_payment"
    VERIFICATION_FAILED = "verification_failed"


class Source(StrEnum):
    """How a payment reached the ledger."""

    WEBHOOK = "webhook"
    RECONCILIATION = "reconciliation"  # found by listing the provider's payments (reconcile.py)


class PaymentStatus(StrEnum):
    """A `payments` row's status: credited (or unattributed until an assign credits it), then
    refunded in part or in whole."""

    UNATTRIBUTED = "unattributed"
    CREDITED = "credited"
    PARTIALLY_REFUNDED = "partially_refunded"
    REFUNDED = "refunded"
