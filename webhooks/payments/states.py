"""The states of the payment path as enums (their values are what the database and the API
hold): a webhook's verdict, and a payment's status."""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """What became of one verified webhook: its answer's `status` (or error code) and the
    `verdict` of its webhook_calls row (docs/payments.md, "Audit trail")."""

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
    DISPUTED = "disputed"  # a dispute holds money withdrawn (payments.disputed_minor > 0)


class Motion(StrEnum):
    """What a provider's notification says happened to money already credited (refunds.py, disputes.py)."""

    REFUND = "refund"  # a named refund succeeded: debit it (once per refund id)
    REFUND_REVERSED = "refund_reversed"  # a refund failed or was canceled: credit back what it took
    CHARGE_REFUNDED = "charge_refunded"  # Stripe's cumulative amount_refunded: debit the difference
    DISPUTE_WITHDRAWN = "dispute_withdrawn"  # the provider took a dispute's money: debit (once per dispute)
    DISPUTE_REINSTATED = "dispute_reinstated"  # it gave the money back: credit (once per dispute)


class RefundStatus(StrEnum):
    """A `refunds` row: its money went back to the payer, or it failed or was canceled after."""

    DEBITED = "debited"
    REVERSED = "reversed"


class DisputeStatus(StrEnum):
    """A `payment_disputes` row: money withdrawn, or given back (or never taken: reinstated first)."""

    WITHDRAWN = "withdrawn"
    REINSTATED = "reinstated"


class Ignored(StrEnum):
    """Why a verified notification moved no money (the `reason` of an `ignored` answer)."""

    EVENT_TYPE = "event_type"  # a type that moves no money
    NOT_SUCCESSFUL = "not_successful"  # a money type whose status says it did not (yet) happen
    DISPUTE_OPEN = "dispute_open"  # a dispute opened or updated, no money withdrawn yet
    NOT_DEBITED = "not_debited"  # a refund that failed before anything was debited for it
    NOT_WITHDRAWN = "not_withdrawn"  # a dispute closed or reinstated whose money was never withdrawn
    UNVERIFIABLE = "unverifiable"  # a payment named by reference only that could not be looked up
