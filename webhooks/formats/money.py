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
# Stripe counts amounts in its own smallest unit (docs.stripe.com/currencies): none for its
# zero-decimal currencies (MGA among them, two decimals in ISO 4217), three decimals for
# BHD, JOD, KWD, OMR, TND, and two for every other, ISK included (zero in ISO 4217: Stripe keeps
# ISK two-decimal, amounts in multiples of 100 since 2023-04-14, support.stripe.com
# "deprecation-of-fractional-isk-charges-and-refunds"). docs/payments.md "Money" names them.
STRIPE_ZERO_DECIMAL = frozenset(
    ["BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "UGX", "VND", "VUV", "XAF", "XOF", "XPF"]
)
STRIPE_THREE_DECIMAL = frozenset(["BHD", "JOD", "KWD", "OMR", "TND"])
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


def stripe_exponent(code: str) -> int:
    """The decimals of Stripe's smallest unit of `code`."""
    return 0 if code in STRIPE_ZERO_DECIMAL else 3 if code in STRIPE_THREE_DECIMAL else 2


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


def to_minor(value: Any, code: str, *, major: bool, exponent_sent: int | None = None) -> int:
    """`value` as a positive integer of `code`'s minor units; `major` says the provider sent
    major units (scaled by the currency exponent) rather than minor units (taken as they are).
    `exponent_sent`: the provider counts in units of 10^-exponent_sent of its own rather than in
    ISO 4217's minor units (Stripe, `stripe_exponent`): rescaled to ISO's."""
    amount = _decimal(value)
    if major:
        minor = amount.scaleb(exponent(code))
    elif exponent_sent is not None:
        minor = amount.scaleb(exponent(code) - exponent_sent)
    else:
        minor = amount
    if minor != minor.to_integral_value():
        raise InvalidPayload(f"amount {value} {code} is not a whole number of minor units")
    result = int(minor)
    if not 0 < result <= MAX_MINOR:
        raise InvalidPayload(f"amount {value} {code} must be positive and at most {MAX_MINOR} minor units")
    return result


def major(minor: int, code: str) -> Decimal:
    """An integer count of `code`'s minor units as a Decimal of its own places (USD 1250 ->
    12.50, JPY 1250 -> 1250, KWD 1250 -> 1.250): the inverse of `to_minor`."""
    places = exponent(code)
    return Decimal(minor).scaleb(-places).quantize(Decimal(1).scaleb(-places))


def text(minor: int, code: str) -> str:
    """`major` as the API writes an amount: "12.50", "-0.05", "1250"."""
    return format(major(minor, code), "f")
