"""The states of the payment path as enums (their values are what the database and the API
hold): a webhook's verdict, and a payment's status."""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """What became of one verified webhook: its answer's `status` (or error code) and the
    `verdict` of its webhook_deliveries row (docs/payments.md, "Audit trail")."""

    CREDITED = "credited"
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


class PaymentStatus(StrEnum):
    """A `payments` row's status: credited, then refunded in part or in whole."""

    CREDITED = "credited"
    PARTIALLY_REFUNDED = "partially_refunded"
    REFUNDED = "refunded"
