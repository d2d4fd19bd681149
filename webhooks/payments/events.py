"""What each provider's (already verified) webhook body means: a PaymentEvent, or a RefundEvent.

Where the fields live is data, one Spec per provider, taken from the table in API.md
("Payment webhooks"); a valid event that is not a success is returned with succeeded=False.
The wallet a payment credits is the merchant's account id from its metadata
(PAYMENT_ACCOUNT_FIELD), else the payer's e-mail; a success naming neither is returned
unattributed (customer None), never refused: its money is real (API.md "Payment attribution
and recovery"). Fees passed on to the payer, partial and over payments and Stripe's currency
rules are each read as the provider documents them (docs/payments.md names the sources).
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
from webhooks.errors import InvalidJSON, MalformedJSON
from webhooks.payments import money
from webhooks.payments.money import InvalidPayload

Path = tuple[str, ...]


@dataclass(frozen=True)
class PaymentEvent:
    provider: str
    event_type: str
    reference: str | None
    amount_minor: int | None  # what the wallet is credited (a fee passed on to the payer left out)
    currency: str | None
    customer: str | None  # the wallet: the merchant's account id, else the payer's e-mail; None: unattributed
    succeeded: bool
    transaction_id: str | None = None  # the provider's own id, where a re-check needs it (Flutterwave)
    payer: str | None = None  # the payer's e-mail, lower-cased, when the payload has a usable one
    fees_minor: int = 0  # the provider's fee the payer paid on top (Paystack requested_amount)
    flag: str | None = None  # partially_paid, overpaid: credited what was received, flagged

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
    metadata: Path | None = None  # the merchant's own data attached to the payment
    requested: Path | None = None  # the amount asked for, when a fee passed on is added to `amount`
    status: Path | None = None  # a payment status naming a partial or an over payment


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


# Monnify's paymentStatus of money received other than in full (developers.monnify.com, "Verify
# transactions": PARTIALLY_PAID "paid less than the required amount", OVERPAID "paid more")
MONNIFY_FLAGS = {"PARTIALLY_PAID": "partially_paid", "OVERPAID": "overpaid"}

SPECS: dict[str, Spec] = {
    "paystack": Spec(
        ("event",),
        _equals(("event",), "charge.success"),
        ("data", "reference"),
        ("data", "amount"),
        False,
        ("data", "currency"),
        ("data", "customer", "email"),
        metadata=("data", "metadata"),
        requested=("data", "requested_amount"),
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
        metadata=("data", "meta"),
    ),
    # PAID, and PARTIALLY_PAID / OVERPAID: money received all the same (amountPaid), flagged
    "monnify": Spec(
        ("eventType",),
        _both(
            _equals(("eventType",), "SUCCESSFUL_TRANSACTION"),
            _one_of(("eventData", "paymentStatus"), frozenset(MONNIFY_FLAGS) | {"PAID"}),
        ),
        ("eventData", "transactionReference"),
        ("eventData", "amountPaid"),
        True,
        ("eventData", "currency"),
        ("eventData", "customer", "email"),
        metadata=("eventData", "metaData"),
        status=("eventData", "paymentStatus"),
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
        metadata=("data", "object", "metadata"),
    ),
    "standard": Spec(
        ("type",),
        _equals(("type",), "payment.succeeded"),
        ("data", "reference"),
        ("data", "amount_minor"),
        False,
        ("data", "currency"),
        ("data", "customer", "email"),
        metadata=("data", "metadata"),
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


def _email_or_none(value: Any) -> str | None:
    try:
        return _email(value)
    except InvalidPayload:
        return None


def _account(metadata: Any, field: str) -> str | None:
    """The wallet the merchant named in its metadata under `field`: a string (or a whole number)
    of 1 to 254 printable characters without spaces; None when there is none. Paystack sends
    metadata as an object, or as a string of JSON when it was given one, or "" / 0 / null
    (its own samples show all four): a string is read as JSON, anything else is no metadata."""
    if isinstance(metadata, str) and metadata.startswith("{") and len(metadata) <= 64 * 1024:
        try:
            metadata = strictjson.loads(metadata.encode())
        except InvalidJSON:  # MalformedJSON too: not JSON, or JSON the strict rules refuse
            return None
    if not isinstance(metadata, dict):
        return None
    value = metadata.get(field)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return wallet(value)


def wallet(value: Any) -> str | None:
    """A wallet's key: 1 to 254 printable characters without spaces, trimmed; an e-mail (it has
    an @) lower-cased, a merchant's account id as it is. None when `value` is none."""
    if not isinstance(value, str):
        return None
    key = value.strip()
    if not 1 <= len(key) <= 254 or not key.isprintable() or " " in key:
        return None
    return key.lower() if "@" in key else key


def _amounts(provider: str, spec: Spec, body: dict, code: str) -> tuple[int, int]:
    """(credited, fees) in minor units. Paystack adds a fee it passes on to the payer to
    `amount` and says what was asked in `requested_amount` (its transaction samples: amount
    40333 = requested 30050 + fees 10283): the wallet is credited what was requested."""
    amount = _get(body, spec.amount)
    if amount is None:
        raise InvalidPayload(f"no amount at {'.'.join(spec.amount)}")
    if provider == "stripe":
        return money.to_minor(amount, code, major=False, exponent_sent=money.stripe_exponent(code)), 0
    paid = money.to_minor(amount, code, major=spec.major)
    requested = None if spec.requested is None else _get(body, spec.requested)
    if requested is None:
        return paid, 0
    asked = money.to_minor(requested, code, major=spec.major)
    return (asked, paid - asked) if asked < paid else (paid, 0)


def parse(provider: str, raw: bytes, account_field: str = "") -> PaymentEvent | RefundEvent:
    """The event in `raw`; InvalidPayload when it is not JSON, has no event type, or is a
    success (or refund) without a usable reference, amount or currency; InvalidJSON when it is
    JSON the strict rules refuse (webhooks/strictjson.py). A success's wallet is the value of
    `account_field` in the merchant's metadata, else the payer's e-mail, else None
    (unattributed)."""
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
    code = money.currency(_get(body, spec.currency))
    credited, fees = _amounts(provider, spec, body, code)
    transaction_id = None if spec.transaction_id is None else _reference(_get(body, spec.transaction_id))
    payer = _email_or_none(_get(body, spec.email))
    account = None
    if account_field and spec.metadata is not None:
        account = _account(_get(body, spec.metadata), account_field)
    status = None if spec.status is None else _get(body, spec.status)
    return PaymentEvent(
        provider,
        event_type[:64],
        reference,
        credited,
        code,
        account or payer,
        True,
        transaction_id,
        payer,
        fees,
        MONNIFY_FLAGS.get(status) if isinstance(status, str) else None,
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
