"""What each provider's (already verified) webhook body says: a notification, of a payment
(PaymentNotification) or of money going back (RefundNotification). Where the fields live is
data, one Spec (and RefundSpec) per provider, each from the provider's own documentation; which
wallet a payment credits, and why a success naming none is kept unattributed, not refused:
docs/payments.md "Which wallet a payment credits" and "Refunds and reversals" (the sources)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from webhooks.errors import InvalidJSON, InvalidPayload
from webhooks.formats import money, strictjson
from webhooks.payments.providers import motions
from webhooks.payments.providers.fields import Path, both, email, equals, get, load, one_of, reference
from webhooks.payments.providers.motions import REFUND_SPECS, RefundNotification
from webhooks.payments.states import Ignored

__all__ = ["REFUND_SPECS", "PaymentNotification", "RefundNotification", "parse", "wallet"]


@dataclass(frozen=True, kw_only=True)
class PaymentNotification:
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
    flag: str | None = None  # partially_paid, overpaid, requested_amount_differs: credited what was received
    reason: Ignored | None = None  # why a valid notification that is no success moves nothing
    by_reference: bool = False  # named by its reference only: the provider's API says the rest

    @property
    def fingerprint(self) -> str:
        """What a repeat of this payment's webhook must agree on (else reference_conflict)."""
        return f"{self.amount_minor}:{self.currency}:{self.customer}"


@dataclass(frozen=True, kw_only=True)
class Spec:
    event_type: Path
    success: Callable[[dict[str, Any]], bool]
    reference: Path
    amount: Path
    major: bool  # amount in major units (scaled by the currency exponent) or already minor
    currency: Path
    email: Path
    transaction_id: Path | None = None
    metadata: Path | None = None  # the merchant's own data attached to the payment
    requested: Path | None = None  # the amount asked for, when a fee passed on is added to `amount`
    status: Path | None = None  # a payment status naming a partial or an over payment


# Flutterwave v4 (developer.flutterwave.com/docs/webhooks, "Structure of a Webhook Payload"): an
# envelope of `type`, `id` (the webhook's), `timestamp` and `data`; a payment succeeded when
# data.status is "succeeded"; data.reference is the merchant's reference, data.id the charge's.
FLUTTERWAVE_V4 = Spec(
    event_type=("type",),
    success=both(equals(("type",), "charge.completed"), equals(("data", "status"), "succeeded")),
    reference=("data", "reference"),
    amount=("data", "amount"),
    major=True,
    currency=("data", "currency"),
    email=("data", "customer", "email"),
    transaction_id=("data", "id"),
    metadata=("data", "meta"),
)

# Monnify's paymentStatus of money received other than in full (developers.monnify.com, "Verify
# transactions": PARTIALLY_PAID "paid less than the required amount", OVERPAID "paid more")
MONNIFY_FLAGS = {"PARTIALLY_PAID": "partially_paid", "OVERPAID": "overpaid"}

SPECS: dict[str, Spec] = {
    "paystack": Spec(
        event_type=("event",),
        success=equals(("event",), "charge.success"),
        reference=("data", "reference"),
        amount=("data", "amount"),
        major=False,
        currency=("data", "currency"),
        email=("data", "customer", "email"),
        metadata=("data", "metadata"),
        requested=("data", "requested_amount"),
    ),
    "flutterwave": Spec(
        event_type=("event",),
        success=both(equals(("event",), "charge.completed"), equals(("data", "status"), "successful")),
        reference=("data", "tx_ref"),
        amount=("data", "amount"),
        major=True,
        currency=("data", "currency"),
        email=("data", "customer", "email"),
        transaction_id=("data", "id"),
        metadata=("data", "meta"),
    ),
    # PAID, and PARTIALLY_PAID / OVERPAID: money received all the same (amountPaid), flagged
    "monnify": Spec(
        event_type=("eventType",),
        success=both(
            equals(("eventType",), "SUCCESSFUL_TRANSACTION"),
            one_of(("eventData", "paymentStatus"), frozenset(MONNIFY_FLAGS) | {"PAID"}),
        ),
        reference=("eventData", "transactionReference"),
        amount=("eventData", "amountPaid"),
        major=True,
        currency=("eventData", "currency"),
        email=("eventData", "customer", "email"),
        metadata=("eventData", "metaData"),
        status=("eventData", "paymentStatus"),
    ),
    "interswitch": Spec(
        event_type=("event",),
        success=both(equals(("event",), "TRANSACTION.COMPLETED"), equals(("data", "responseCode"), "00")),
        reference=("data", "transactionRef"),
        amount=("data", "amount"),
        major=False,
        currency=("data", "currency"),
        email=("data", "customer", "email"),
    ),
    "stripe": Spec(
        event_type=("type",),
        success=equals(("type",), "payment_intent.succeeded"),
        reference=("data", "object", "id"),
        amount=("data", "object", "amount_received"),
        major=False,
        currency=("data", "object", "currency"),
        email=("data", "object", "receipt_email"),
        metadata=("data", "object", "metadata"),
    ),
    "standard": Spec(
        event_type=("type",),
        success=equals(("type",), "payment.succeeded"),
        reference=("data", "reference"),
        amount=("data", "amount_minor"),
        major=False,
        currency=("data", "currency"),
        email=("data", "customer", "email"),
        metadata=("data", "metadata"),
    ),
}


def _email_or_none(value: Any) -> str | None:
    try:
        return email(value)
    except InvalidPayload:
        return None


def _account(metadata: Any, field: str) -> str | None:
    """The wallet the merchant named in its metadata under `field`: a string (or a whole number)
    of 1 to 254 printable characters without spaces; None when there is none. Paystack sends
    metadata as an object, or as a string of JSON when it was given one, or "" / 0 / null
    (its own samples show all four): a string is read as JSON, anything else is no metadata."""
    # JSON allows whitespace before the object (RFC 8259 section 2): " {...}" is a stringified object too
    if isinstance(metadata, str) and metadata.lstrip(" \t\r\n").startswith("{") and len(metadata) <= 64 * 1024:
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


# Paystack's flag when `requested_amount` is below `amount` but the difference is not its `fees`
# (its POS sample: amount "5000", requested_amount "200", fees null): what was paid is credited.
REQUESTED_DIFFERS = "requested_amount_differs"


def _amounts(provider: str, spec: Spec, body: dict[str, Any], code: str) -> tuple[int, int, str | None]:
    """(credited, fees, flag) in minor units. Paystack adds a fee it passes on to the payer to
    `amount` and says what was asked in `requested_amount` (its transaction samples: amount
    40333 = requested 30050 + fees 10283): the wallet is credited what was requested, but only
    when the difference is the transaction's `fees`; otherwise (its terminal sample: 5000 paid,
    200 requested, no fees) what was paid, flagged: never less than was paid, silently."""
    amount = get(body, spec.amount)
    if amount is None:
        raise InvalidPayload(f"no amount at {'.'.join(spec.amount)}")
    if provider == "stripe":
        return money.to_minor(amount, code, major=False, exponent_sent=money.stripe_exponent(code)), 0, None
    paid = money.to_minor(amount, code, major=spec.major)
    requested = None if spec.requested is None else get(body, spec.requested)
    if requested is None:
        return paid, 0, None
    asked = money.to_minor(requested, code, major=spec.major)
    if asked >= paid:
        return paid, 0, None
    try:
        fees = money.to_minor(get(body, ("data", "fees")), code, major=spec.major)
    except InvalidPayload:  # null, 0, not an amount
        fees = None
    if fees == paid - asked:
        return asked, fees, None
    return paid, 0, REQUESTED_DIFFERS


# The types whose status decides whether money moved (an `ignored` one of these is
# not_successful; any other type moves no money: event_type).
MONEY_TYPES = {
    "paystack": frozenset(
        {"charge.success", "refund.processed", "refund.pending", "refund.processing", "refund.failed"}
    ),
    "flutterwave": frozenset({"charge.completed"}),
    "monnify": frozenset({"SUCCESSFUL_TRANSACTION", "SUCCESSFUL_REFUND", "FAILED_REFUND"}),
    "interswitch": frozenset({"TRANSACTION.COMPLETED"}),
    "stripe": frozenset({"payment_intent.succeeded"}),
    "standard": frozenset({"payment.succeeded", "payment.refunded"}),
}

# Stripe's Charges API (no PaymentIntent): a `charge.succeeded` Charge is the payment, keyed by
# its id (stripe-python `_charge.py`: amount_captured, captured, paid, status, payment_intent None).
STRIPE_CHARGE = Spec(
    event_type=("type",),
    success=both(
        equals(("type",), "charge.succeeded"),
        equals(("data", "object", "status"), "succeeded"),
        lambda body: get(body, ("data", "object", "paid")) is True,
    ),
    reference=("data", "object", "id"),
    amount=("data", "object", "amount_captured"),
    major=False,
    currency=("data", "object", "currency"),
    email=("data", "object", "receipt_email"),
    metadata=("data", "object", "metadata"),
)


def _envelope(provider: str, body: dict[str, Any]) -> Spec:
    """The provider's Spec, or Flutterwave v4's for a body in its envelope (`type` and `data`, no
    v3 `event`)."""
    if provider == "flutterwave" and "event" not in body and isinstance(body.get("data"), dict):
        return FLUTTERWAVE_V4
    return SPECS[provider]


def _spec(provider: str, event_type: str, body: dict[str, Any]) -> Spec:
    """The body's Spec; Stripe's Charges API payment (a charge without a PaymentIntent, whose
    own `payment_intent.succeeded` credits it otherwise) has its own."""
    if (
        provider == "stripe"
        and event_type == "charge.succeeded"
        and not get(body, ("data", "object", "payment_intent"))
    ):
        return STRIPE_CHARGE
    return _envelope(provider, body)


def _flat(provider: str, body: dict[str, Any]) -> PaymentNotification | None:
    """Flutterwave's flat payload (`txRef`, `status`, no `event` or `data`), as Flutterwave's own
    WooCommerce plugin reads it: a reference to look up with Flutterwave's API, which says the
    amount, currency and payer (docs/payments.md "Formats in use today"). None for other bodies."""
    if provider != "flutterwave" or "event" in body or isinstance(body.get("data"), dict) or "txRef" not in body:
        return None
    kind = body.get("event.type")
    ref = reference(body.get("txRef"))
    successful = body.get("status") == "successful"
    return PaymentNotification(
        provider=provider,
        event_type=kind[:64] if isinstance(kind, str) and kind.isprintable() and kind else "txRef",
        reference=ref,
        amount_minor=None,
        currency=None,
        customer=None,
        succeeded=successful and ref is not None,
        reason=None if successful and ref else Ignored.UNVERIFIABLE if successful else Ignored.NOT_SUCCESSFUL,
        by_reference=True,
    )


def parse(provider: str, raw: bytes, account_field: str = "") -> PaymentNotification | RefundNotification:
    """The event in `raw`; InvalidPayload when it is not JSON, has no event type, or is a
    success (or refund) without a usable reference, amount or currency; InvalidJSON when it is
    JSON the strict rules refuse (webhooks/formats/strictjson.py). A success's wallet is the value of
    `account_field` in the merchant's metadata, else the payer's e-mail, else None
    (unattributed)."""
    body = load(raw)
    if (flat := _flat(provider, body)) is not None:
        return flat
    where = _envelope(provider, body).event_type
    event_type = get(body, where)
    if not isinstance(event_type, str) or not event_type:
        raise InvalidPayload(f"no event type at {'.'.join(where)}")
    event_type = event_type[:64]
    motion = motions.spec_of(provider, event_type, body)
    if isinstance(motion, motions.RefundSpec):
        return motions.parse(provider, event_type, body, motion)
    spec = _spec(provider, event_type, body)
    ref = reference(get(body, spec.reference))
    if motion is not None or not spec.success(body):
        reason = motion or (Ignored.NOT_SUCCESSFUL if event_type in MONEY_TYPES[provider] else Ignored.EVENT_TYPE)
        return PaymentNotification(
            provider=provider,
            event_type=event_type,
            reference=ref,
            amount_minor=None,
            currency=None,
            customer=None,
            succeeded=False,
            reason=reason,
        )
    if ref is None:
        raise InvalidPayload(f"no reference at {'.'.join(spec.reference)} (1 to 128 characters)")
    code = money.currency(get(body, spec.currency))
    credited, fees, fee_flag = _amounts(provider, spec, body, code)
    transaction_id = None if spec.transaction_id is None else reference(get(body, spec.transaction_id))
    payer = _email_or_none(get(body, spec.email))
    account = None
    if account_field and spec.metadata is not None:
        account = _account(get(body, spec.metadata), account_field)
    status = None if spec.status is None else get(body, spec.status)
    return PaymentNotification(
        provider=provider,
        event_type=event_type,
        reference=ref,
        amount_minor=credited,
        currency=code,
        customer=account or payer,
        succeeded=True,
        transaction_id=transaction_id,
        payer=payer,
        fees_minor=fees,
        flag=(MONNIFY_FLAGS.get(status) if isinstance(status, str) else None) or fee_flag,
    )
