"""What a provider's (verified) notification says about money going back: a refund, a refund that failed
after it was debited, Stripe's cumulative `charge.refunded`, a dispute's money withdrawn or
reinstated. Each provider's shape comes from its own documentation or SDK (docs/payments.md,
"Money going back", names each source); a provider that documents none has no entry here, and
its notifications of that kind are `ignored`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from webhooks.errors import InvalidPayload
from webhooks.formats import money
from webhooks.payments.providers.fields import Path, both, email, equals, get, one_of, reference
from webhooks.payments.states import Ignored, Motion


@dataclass(frozen=True, kw_only=True)
class RefundNotification:
    """Money of an earlier payment going back (or returning): moves the wallet once per
    (reference, kind). `reference` is the refund's, the dispute's, or (charge.refunded) the charge's."""

    provider: str
    event_type: str
    reference: str
    payment_reference: str  # the payment's reference (as its credit was keyed)
    amount: Decimal | int | str  # as sent: major units when `major`, else minor (Stripe: its own)
    major: bool
    currency: str | None  # None when the payload names none (Monnify): the payment's
    customer: str | None  # the payer's e-mail, where the payload carries it
    kind: Motion = Motion.REFUND

    def amount_minor(self, code: str) -> int:
        """The amount in minor units of `code` (the payment's currency); Stripe counts in its
        own decimals (money.stripe_exponent), as for its payments."""
        if self.provider == "stripe":
            return money.to_minor(self.amount, code, major=False, exponent_sent=money.stripe_exponent(code))
        return money.to_minor(self.amount, code, major=self.major)

    @property
    def fingerprint(self) -> str:
        """What a repeat of this notification must agree on (a refund's failure, a dispute's
        reinstatement, a later cumulative amount differ from what came before: not repeats)."""
        base = f"{self.payment_reference}:{self.amount}:{self.currency}"
        return base if self.kind is Motion.REFUND else f"{self.kind}:{base}"


@dataclass(frozen=True, kw_only=True)
class RefundSpec:
    applies: Callable[[dict[str, Any]], bool]  # a refund whose money went back (others are ignored)
    reference: Path
    payment_reference: Path
    amount: Path
    major: bool
    currency: Path | None  # None: the payment's currency
    email: Path | None  # None: the payment's payer
    kind: Motion = Motion.REFUND


# Refunds and reversals, each as its provider's own text describes it. Flutterwave (v3 documents
# refunds as an API call with no webhook) and Interswitch (its webhook events name no refund or
# reversal) have none: their refund notifications are `ignored`.
REFUND_SPECS: dict[str, RefundSpec] = {
    # refund.processed: the refund reached the customer (refund.pending/processing/failed: not yet or not)
    "paystack": RefundSpec(
        applies=equals(("event",), "refund.processed"),
        reference=("data", "refund_reference"),
        payment_reference=("data", "transaction_reference"),
        amount=("data", "amount"),
        major=False,
        currency=("data", "currency"),
        email=("data", "customer", "email"),
    ),
    # SUCCESSFUL_REFUND with refundStatus COMPLETED; the payload names neither currency nor payer
    "monnify": RefundSpec(
        applies=both(equals(("eventType",), "SUCCESSFUL_REFUND"), equals(("eventData", "refundStatus"), "COMPLETED")),
        reference=("eventData", "refundReference"),
        payment_reference=("eventData", "transactionReference"),
        amount=("eventData", "refundAmount"),
        major=True,
        currency=None,
        email=None,
    ),
    # A Refund object that succeeded, from whichever of the three events carries it first
    "stripe": RefundSpec(
        applies=both(
            one_of(("type",), frozenset({"refund.created", "refund.updated", "charge.refund.updated"})),
            equals(("data", "object", "object"), "refund"),
            equals(("data", "object", "status"), "succeeded"),
        ),
        reference=("data", "object", "id"),
        payment_reference=("data", "object", "payment_intent"),
        amount=("data", "object", "amount"),
        major=False,
        currency=("data", "object", "currency"),
        email=None,
    ),
    "standard": RefundSpec(
        applies=equals(("type",), "payment.refunded"),
        reference=("data", "reference"),
        payment_reference=("data", "payment_reference"),
        amount=("data", "amount_minor"),
        major=False,
        currency=("data", "currency"),
        email=("data", "customer", "email"),
    ),
}

_STRIPE_OBJECT = ("data", "object")
_STRIPE_REFUND_TYPES = frozenset({"refund.created", "refund.updated", "refund.failed", "charge.refund.updated"})
_STRIPE_TAKEN = {"charge.dispute.funds_withdrawn": Motion.DISPUTE_WITHDRAWN}
_STRIPE_GIVEN = {"charge.dispute.funds_reinstated": Motion.DISPUTE_REINSTATED}
# Paystack's resolve-dispute call takes `resolution` merchant-accepted | declined (its API reference);
# its webhook sample shows auto-accepted with the transaction `reversed`: declined returns nothing.
_PAYSTACK_DECLINED = "declined"


def _id(value: Any) -> Any:
    """A Stripe id, whether the field holds it or the expanded object."""
    return value.get("id") if isinstance(value, dict) else value


def _stripe_spec(paid: Path, amount: Path, kind: Motion) -> RefundSpec:
    obj = ("data", "object")
    return RefundSpec(
        applies=bool,
        reference=(*obj, "id"),
        payment_reference=paid,
        amount=amount,
        major=False,
        currency=(*obj, "currency"),
        email=None,
        kind=kind,
    )


def _stripe(event_type: str, body: dict[str, Any]) -> RefundSpec | Ignored | None:
    """Stripe (stripe-python's Refund, Charge and Dispute objects): which motion `body` is. The
    payment is its PaymentIntent, or for the Charges API (no PaymentIntent) its charge."""
    obj = get(body, _STRIPE_OBJECT)
    if not isinstance(obj, dict):
        return None
    paid: Path = (*_STRIPE_OBJECT, "payment_intent" if _id(obj.get("payment_intent")) else "charge")
    amount: Path = (*_STRIPE_OBJECT, "amount")
    if event_type in _STRIPE_REFUND_TYPES and obj.get("object") == "refund":
        status = obj.get("status")
        if event_type == "refund.failed" or status in ("failed", "canceled"):
            return _stripe_spec(paid, amount, Motion.REFUND_REVERSED)
        if status == "succeeded":
            return _stripe_spec(paid, amount, Motion.REFUND)
        return Ignored.NOT_SUCCESSFUL  # pending, requires_action: not yet
    if event_type == "charge.refunded" and obj.get("object") == "charge":
        if not _id(obj.get("payment_intent")):
            paid = (*_STRIPE_OBJECT, "id")  # a Charges API payment is keyed by its charge id
        return _stripe_spec(paid, (*_STRIPE_OBJECT, "amount_refunded"), Motion.CHARGE_REFUNDED)
    if event_type.startswith("charge.dispute.") and obj.get("object") == "dispute":
        kind = _stripe_dispute(event_type, obj)
        return kind if isinstance(kind, Ignored) else _stripe_spec(paid, amount, kind)
    return None


def _stripe_dispute(event_type: str, dispute: dict[str, Any]) -> Motion | Ignored:
    """What a Stripe dispute notification does to the money: a Motion, or why it moves none."""
    kind = _STRIPE_TAKEN.get(event_type) or _STRIPE_GIVEN.get(event_type)
    if kind is None and event_type == "charge.dispute.closed":
        # lost: the money stays withdrawn (once, with or without funds_withdrawn before it);
        # won: it comes back (once, with or without funds_reinstated after it)
        kind = {"lost": Motion.DISPUTE_WITHDRAWN, "won": Motion.DISPUTE_REINSTATED}.get(str(dispute.get("status")))
        if kind is None:
            return Ignored.NOT_WITHDRAWN  # warning_closed: an inquiry that took nothing
    if kind is None:
        return Ignored.DISPUTE_OPEN
    return kind


def _paystack(event_type: str, body: dict[str, Any]) -> RefundSpec | Ignored | None:
    """Paystack's dispute events (PaystackOSS/doc-code-snippets, src/doc/payments/webhooks/events/
    charge-dispute-*.json): only a resolution that returned money to the payer moves any."""
    if event_type in ("charge.dispute.create", "charge.dispute.remind"):
        return Ignored.DISPUTE_OPEN
    if event_type != "charge.dispute.resolve":
        return None
    refunded = get(body, ("data", "refund_amount"))
    if get(body, ("data", "resolution")) == _PAYSTACK_DECLINED or refunded in (None, 0, "0"):
        return Ignored.NOT_WITHDRAWN
    return RefundSpec(
        applies=bool,
        reference=("data", "id"),
        payment_reference=("data", "transaction", "reference"),
        amount=("data", "refund_amount"),
        major=False,
        currency=("data", "currency"),
        email=("data", "customer", "email"),
        kind=Motion.DISPUTE_WITHDRAWN,
    )


_SHAPES: dict[str, Callable[[str, dict[str, Any]], RefundSpec | Ignored | None]] = {
    "stripe": _stripe,
    "paystack": _paystack,
}


def spec_of(provider: str, event_type: str, body: dict[str, Any]) -> RefundSpec | Ignored | None:
    """The motion `body` describes; an Ignored reason for a money-going-back notification that
    moves nothing (yet); None when it is no such notification (a payment's, or another type)."""
    shape = _SHAPES.get(provider)
    found = None if shape is None else shape(event_type, body)
    if found is not None:
        return found
    spec = REFUND_SPECS.get(provider)
    return spec if spec is not None and spec.applies(body) else None


def parse(provider: str, event_type: str, body: dict[str, Any], spec: RefundSpec) -> RefundNotification:
    """The RefundNotification `spec` reads from `body`; InvalidPayload without a usable reference,
    payment reference, amount or currency."""
    ref = reference(get(body, spec.reference))
    if ref is None:
        raise InvalidPayload(f"no refund reference at {'.'.join(spec.reference)} (1 to 128 characters)")
    payment_reference = reference(_id(get(body, spec.payment_reference)))
    if payment_reference is None:
        raise InvalidPayload(f"no payment reference at {'.'.join(spec.payment_reference)}")
    amount = get(body, spec.amount)
    if amount is None:
        raise InvalidPayload(f"no amount at {'.'.join(spec.amount)}")
    code = None if spec.currency is None else money.currency(get(body, spec.currency))
    mail = None if spec.email is None else get(body, spec.email)
    note = RefundNotification(
        provider=provider,
        event_type=event_type,
        reference=ref,
        payment_reference=payment_reference,
        amount=amount,
        major=spec.major,
        currency=code,
        customer=None if mail is None else email(mail),
        kind=spec.kind,
    )
    if code is not None:  # else the ledger converts it with the payment's currency
        note.amount_minor(code)  # refuse a bad amount before anything is locked
    return note
