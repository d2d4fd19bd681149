"""What each provider's (already verified) webhook body means: a PaymentEvent.

Where the fields live is data, one Spec per provider, taken from the table in API.md
("Payment webhooks"); a valid event that is not a success is returned with succeeded=False.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
        """What a repeated delivery of this payment must agree on (else reference_conflict)."""
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


SPECS: dict[str, Spec] = {
    "paystack": Spec(("event",), _equals(("event",), "charge.success"),
                     ("data", "reference"), ("data", "amount"), False,
                     ("data", "currency"), ("data", "customer", "email")),
    "flutterwave": Spec(("event",), _both(_equals(("event",), "charge.completed"),
                                          _equals(("data", "status"), "successful")),
                        ("data", "tx_ref"), ("data", "amount"), True,
                        ("data", "currency"), ("data", "customer", "email"), ("data", "id")),
    "monnify": Spec(("eventType",), _both(_equals(("eventType",), "SUCCESSFUL_TRANSACTION"),
                                          _equals(("eventData", "paymentStatus"), "PAID")),
                    ("eventData", "transactionReference"), ("eventData", "amountPaid"), True,
                    ("eventData", "currency"), ("eventData", "customer", "email")),
    "interswitch": Spec(("event",), _both(_equals(("event",), "TRANSACTION.COMPLETED"),
                                          _equals(("data", "responseCode"), "00")),
                        ("data", "transactionRef"), ("data", "amount"), False,
                        ("data", "currency"), ("data", "customer", "email")),
    "stripe": Spec(("type",), _equals(("type",), "payment_intent.succeeded"),
                   ("data", "object", "id"), ("data", "object", "amount_received"), False,
                   ("data", "object", "currency"), ("data", "object", "receipt_email")),
    "standard": Spec(("type",), _equals(("type",), "payment.succeeded"),
                     ("data", "reference"), ("data", "amount_minor"), False,
                     ("data", "currency"), ("data", "customer", "email")),
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


def parse(provider: str, raw: bytes) -> PaymentEvent:
    """The event in `raw`; InvalidPayload when it is not JSON, has no event type, or is a
    success without a usable reference, amount, currency or payer e-mail; InvalidJSON when
    it is JSON the strict rules refuse (webhooks/strictjson.py)."""
    spec = SPECS[provider]
    body = _json(raw)
    event_type = _get(body, spec.event_type)
    if not isinstance(event_type, str) or not event_type:
        raise InvalidPayload(f"no event type at {'.'.join(spec.event_type)}")
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
    return PaymentEvent(provider, event_type[:64], reference, money.to_minor(amount, code, major=spec.major),
                        code, _email(_get(body, spec.email)), True, transaction_id)
