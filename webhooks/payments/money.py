"""Money from provider payloads: ISO 4217 codes and integer minor units, computed with Decimal.

Providers send amounts in major units (Flutterwave, Monnify: 100.50 naira) or already in minor
units (Paystack, Interswitch, Stripe: 10050 kobo). Either way the ledger stores an integer count
of the currency's minor unit; an amount that is not a whole number of minor units is refused.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from webhooks.errors import InvalidPayload

# ISO 4217 minor-unit exponents that differ from the usual 2 (NGN, USD, GHS, KES, ZAR, EUR, GBP...).
EXPONENTS: dict[str, int] = {
    **dict.fromkeys(("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX",
                     "UYI", "VND", "VUV", "XAF", "XOF", "XPF"), 0),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
    **dict.fromkeys(("CLF", "UYW"), 4),
}
DEFAULT_EXPONENT = 2
MAX_MINOR = 10**15  # far above any single payment, far below BIGINT: wallet sums cannot overflow
_CURRENCY_RE = re.compile(r"^[A-Z]{3}$")


def currency(value: Any) -> str:
    """An ISO 4217 alphabetic code, upper-cased (`usd` from a provider is `USD`)."""
    code = value.strip().upper() if isinstance(value, str) else ""
    if not _CURRENCY_RE.match(code):
        raise InvalidPayload(f"currency {value!r} is not a three-letter ISO 4217 code")
    return code


def exponent(code: str) -> int:
    return EXPONENTS.get(code, DEFAULT_EXPONENT)


def _decimal(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise InvalidPayload(f"amount {value!r} is not a number")
    try:
        amount = Decimal(value.strip()) if isinstance(value, str) else Decimal(str(value))
    except InvalidOperation:
        raise InvalidPayload(f"amount {value!r} is not a number") from None
    if not amount.is_finite():
        raise InvalidPayload(f"amount {value!r} is not a finite number")
    return amount


def to_minor(value: Any, code: str, *, major: bool) -> int:
    """`value` as a positive integer of `code`'s minor units; `major` says the provider sent
    major units (scaled by the currency exponent) rather than minor units (taken as they are)."""
    amount = _decimal(value)
    minor = amount.scaleb(exponent(code)) if major else amount
    if minor != minor.to_integral_value():
        raise InvalidPayload(f"amount {value} {code} is not a whole number of minor units")
    result = int(minor)
    if not 0 < result <= MAX_MINOR:
        raise InvalidPayload(f"amount {value} {code} must be positive and at most {MAX_MINOR} minor units")
    return result
