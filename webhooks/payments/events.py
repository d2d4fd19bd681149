"""What each provider's (already verified) webhook body means: a PaymentEvent, or a RefundEvent.

Where the fields live is data, one Spec per provider, taken from the table in API.md
("Payment webhooks"); a valid event that is not a success is returned with succeeded=False.
Refunds and reversals have a RefundSpec per provider whose own documentation names one
(docs/payments.md, "Refunds and reversals", gives each source); the others have none, and
their refund events are valid events that credit nothing (`ignored`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from webhooks import strictjson
from webhooks.errors import MalformedJSON
from webhooks.payments import money
from webhooks.payments.money import InvalidPayload

Path = tuple[str, ...]


@dataclass(frozen=True)
class PaymentEvent:
    provider: str
    event_type: str
    reference: str | None
    amount_minor: int | None
    currency: str | None
    customer: str | None  # payer e-mail, lower-cased
    succeeded: bool
    transaction_id: str | None = None  # the provider's own id, where a re-check needs it (Flutterwave)

    @property
    def fingerprint(self) -> str:
        """What a repeat of this payment's webhook must agree on (else reference_conflict)."""
        return f"{self.amount_minor}:{self.currency}:{self.customer}"


@dataclass(frozen=True)
class Spec:
    event_type: Path
    success: Callable[[dict], bool]
    reference: Path
    amount: Path
    major: bool  # amount in major units (scaled by the currency exponent) or already minor
    currency: Path
    email: Path
    transaction_id: Path | None = None


@dataclass(frozen=True)
class RefundEvent:
    """A refund or reversal of an earlier payment: debits the payer's wallet once per reference."""

    provider: str
    event_type: str
    reference: str  # the refund's own reference
    payment_reference: str  # the refunded payment's reference (as its credit was keyed)
    amount: Decimal | int | str  # as sent: major units when `major`, else minor
    major: bool
    currency: str | None  # None when the payload names none (Monnify): the payment's
    customer: str | None  # the payer's e-mail, where the payload carries it

    def amount_minor(self, code: str) -> int:
        """The amount in minor units of `code` (the payment's currency)."""
        return money.to_minor(self.amount, code, major=self.major)

    @property
    def fingerprint(self) -> str:
        """What a repeat of this refund's webhook must agree on."""
        return f"{self.payment_reference}:{self.amount}:{self.currency}"


@dataclass(frozen=True)
class RefundSpec:
    applies: Callable[[dict], bool]  # a refund whose money went back (others are ignored)
    reference: Path
    payment_reference: Path
    amount: Path
    major: bool
    currency: Path | None  # None: the payment's currency
    email: Path | None  # None: the payment's payer


def _get(body: Any, path: Path) -> Any:
    for part in path:
        if not isinstance(body, dict):
            return None
        body = body.get(part)
    return body


def _equals(path: Path, value: str) -> Callable[[dict], bool]:
    return lambda body: _get(body, path) == value


def _both(*checks: Callable[[dict], bool]) -> Callable[[dict], bool]:
    return lambda body: all(check(body) for check in checks)


def _one_of(path: Path, values: frozenset[str]) -> Callable[[dict], bool]:
    return lambda body: _get(body, path) in values


SPECS: dict[str, Spec] = {
    "paystack": Spec(
        ("event",),
        _equals(("event",), "charge.success"),
        ("data", "reference"),
        ("data", "amount"),
        False,
        ("data", "currency"),
        ("data", "customer", "email"),
    ),
    "flutterwave": Spec(
        ("event",),
        _both(_equals(("event",), "charge.completed"), _equals(("data", "status"), "successful")),
        ("data", "tx_ref"),
        ("data", "amount"),
        True,
        ("data", "currency"),
        ("data", "customer", "email"),
        ("data", "id"),
    ),
    "monnify": Spec(
        ("eventType",),
        _both(_equals(("eventType",), "SUCCESSFUL_TRANSACTION"), _equals(("eventData", "paymentStatus"), "PAID")),
        ("eventData", "transactionReference"),
        ("eventData", "amountPaid"),
        True,
        ("eventData", "currency"),
        ("eventData", "customer", "email"),
    ),
    "interswitch": Spec(
        ("event",),
        _both(_equals(("event",), "TRANSACTION.COMPLETED"), _equals(("data", "responseCode"), "00")),
        ("data", "transactionRef"),
        ("data", "amount"),
        False,
        ("data", "currency"),
        ("data", "customer", "email"),
    ),
    "stripe": Spec(
        ("type",),
        _equals(("type",), "payment_intent.succeeded"),
        ("data", "object", "id"),
        ("data", "object", "amount_received"),
        False,
        ("data", "object", "currency"),
        ("data", "object", "receipt_email"),
    ),
    "standard": Spec(
        ("type",),
        _equals(("type",), "payment.succeeded"),
        ("data", "reference"),
        ("data", "amount_minor"),
        False,
        ("data", "currency"),
        ("data", "customer", "email"),
    ),
}


# Refunds and reversals, each as its provider's own text describes it (docs/payments.md names the
# source). Flutterwave (v3 documents refunds as an API call with no webhook) and Interswitch (its
# webhook events name no refund or reversal) have none: their refund events are `ignored`.
REFUND_SPECS: dict[str, RefundSpec] = {
    # refund.processed: the refund reached the customer (refund.pending/processing/failed: not yet or not)
    "paystack": RefundSpec(
        _equals(("event",), "refund.processed"),
        ("data", "refund_reference"),
        ("data", "transaction_reference"),
        ("data", "amount"),
        False,
        ("data", "currency"),
        ("data", "customer", "email"),
    ),
    # SUCCESSFUL_REFUND with refundStatus COMPLETED; the payload names neither currency nor payer
    "monnify": RefundSpec(
        _both(_equals(("eventType",), "SUCCESSFUL_REFUND"), _equals(("eventData", "refundStatus"), "COMPLETED")),
        ("eventData", "refundReference"),
        ("eventData", "transactionReference"),
        ("eventData", "refundAmount"),
        True,
        None,
        None,
    ),
    # A Refund object that succeeded, from whichever of the three events carries it first (one
    # refund id debits once); charge.refunded (a Charge, cumulative) is left ignored.
    "stripe": RefundSpec(
        _both(
            _one_of(("type",), frozenset({"refund.created", "refund.updated", "charge.refund.updated"})),
            _equals(("data", "object", "object"), "refund"),
            _equals(("data", "object", "status"), "succeeded"),
        ),
        ("data", "object", "id"),
        ("data", "object", "payment_intent"),
        ("data", "object", "amount"),
        False,
        ("data", "object", "currency"),
        None,
    ),
    "standard": RefundSpec(
        _equals(("type",), "payment.refunded"),
        ("data", "reference"),
        ("data", "payment_reference"),
        ("data", "amount_minor"),
        False,
        ("data", "currency"),
        ("data", "customer", "email"),
    ),
}


def _json(raw: bytes) -> dict:
    """The body, amounts as Decimal. Not JSON at all: invalid_payload (API.md's "body not
    parseable"); JSON the strict rules refuse (NaN, duplicate keys, ...): InvalidJSON."""
    try:
        body = strictjson.loads(raw, decimals=True)
    except MalformedJSON:
        raise InvalidPayload("body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidPayload("body is not a JSON object")
    return body


def _reference(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and 0 < len(value) <= 128 and value.isprintable():
        return value
    return None


def _email(value: Any) -> str:
    email = value.strip().lower() if isinstance(value, str) else ""
    if not 3 <= len(email) <= 254 or "@" not in email or not email.isprintable() or " " in email:
        raise InvalidPayload(f"payer e-mail {value!r} is missing or invalid")
    return email


def parse(provider: str, raw: bytes) -> PaymentEvent | RefundEvent:
    """The event in `raw`; InvalidPayload when it is not JSON, has no event type, or is a
    success (or refund) without a usable reference, amount, currency or payer e-mail;
    InvalidJSON when it is JSON the strict rules refuse (webhooks/strictjson.py)."""
    spec = SPECS[provider]
    body = _json(raw)
    event_type = _get(body, spec.event_type)
    if not isinstance(event_type, str) or not event_type:
        raise InvalidPayload(f"no event type at {'.'.join(spec.event_type)}")
    refund = REFUND_SPECS.get(provider)
    if refund is not None and refund.applies(body):
        return _refund(provider, event_type[:64], body, refund)
    reference = _reference(_get(body, spec.reference))
    if not spec.success(body):
        return PaymentEvent(provider, event_type[:64], reference, None, None, None, False)
    if reference is None:
        raise InvalidPayload(f"no reference at {'.'.join(spec.reference)} (1 to 128 characters)")
    amount = _get(body, spec.amount)
    if amount is None:
        raise InvalidPayload(f"no amount at {'.'.join(spec.amount)}")
    code = money.currency(_get(body, spec.currency))
    transaction_id = None if spec.transaction_id is None else _reference(_get(body, spec.transaction_id))
    return PaymentEvent(
        provider,
        event_type[:64],
        reference,
        money.to_minor(amount, code, major=spec.major),
        code,
        _email(_get(body, spec.email)),
        True,
        transaction_id,
    )


def _refund(provider: str, event_type: str, body: dict, spec: RefundSpec) -> RefundEvent:
    reference = _reference(_get(body, spec.reference))
    if reference is None:
        raise InvalidPayload(f"no refund reference at {'.'.join(spec.reference)} (1 to 128 characters)")
    paid = _get(body, spec.payment_reference)
    if isinstance(paid, dict):  # Stripe: an expanded PaymentIntent
        paid = paid.get("id")
    payment_reference = _reference(paid)
    if payment_reference is None:
        raise InvalidPayload(f"no payment reference at {'.'.join(spec.payment_reference)}")
    amount = _get(body, spec.amount)
    if amount is None:
        raise InvalidPayload(f"no amount at {'.'.join(spec.amount)}")
    code = None if spec.currency is None else money.currency(_get(body, spec.currency))
    if code is not None:  # else the ledger converts it with the payment's currency
        money.to_minor(amount, code, major=spec.major)  # refuse a bad amount before anything is locked
    email = None if spec.email is None else _get(body, spec.email)
    customer = None if email is None else _email(email)
    return RefundEvent(provider, event_type, reference, payment_reference, amount, spec.major, code, customer)
