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

# ISO 4217 alphabetic codes of current currencies and funds (List One, as Debian's iso-codes
# 4.15 ships it, plus ZWG and XCG added since), without the codes that are no money one pays
# in: precious metals, bond-market units, SDR, XSU, XUA (their minor unit is "N.A."), XTS
# (testing) and XXX (no currency).
_CODES = """
AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BOV BRL BSD BTN BWP
BYN BZD CAD CDF CHE CHF CHW CLF CLP CNY COP COU CRC CUC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB
EUR FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HRK HTG HUF IDR ILS INR IQD IRR ISK JMD JOD
JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP MRU
MUR MVR MWK MXN MXV MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD
RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SLL SOS SRD SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY
TTD TWD TZS UAH UGX USD USN UYI UYU UYW UZS VED VES VND VUV WST XAF XCD XCG XOF XPF YER ZAR ZMW
ZWG ZWL
"""  # as the list prints them
CURRENCIES = frozenset(_CODES.split())
# ISO 4217 minor-unit exponents that differ from the usual 2 (NGN, USD, GHS, KES, ZAR, EUR, GBP...).
EXPONENTS: dict[str, int] = {
    **dict.fromkeys(
        (
            "BIF",
            "CLP",
            "DJF",
            "GNF",
            "ISK",
            "JPY",
            "KMF",
            "KRW",
            "PYG",
            "RWF",
            "UGX",
            "UYI",
            "VND",
            "VUV",
            "XAF",
            "XOF",
            "XPF",
        ),
        0,
    ),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
    **dict.fromkeys(("CLF", "UYW"), 4),
}
DEFAULT_EXPONENT = 2
MAX_MINOR = 10**15  # far above any single payment, far below BIGINT: wallet sums cannot overflow
# A decimal string from a provider: ASCII digits, an optional fraction (at most as many
# places as the currency has minor units: checked by to_minor). No sign, exponent, `_`,
# whitespace or non-ASCII digit, all of which Decimal() would take.
_DECIMAL_STRING = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def currency(value: Any) -> str:
    """An ISO 4217 alphabetic code, upper-cased (`usd` from a provider is `USD`)."""
    code = value.strip().upper() if isinstance(value, str) else ""
    if code not in CURRENCIES:
        raise InvalidPayload(f"currency {value!r} is not an ISO 4217 currency code")
    return code


def exponent(code: str) -> int:
    return EXPONENTS.get(code, DEFAULT_EXPONENT)


def _decimal(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise InvalidPayload(f"amount {value!r} is not a number")
    if isinstance(value, str) and not _DECIMAL_STRING.fullmatch(value):
        raise InvalidPayload(f"amount {value[:32]!r} is not a decimal string of ASCII digits")
    try:
        amount = Decimal(value) if isinstance(value, str) else Decimal(str(value))
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
