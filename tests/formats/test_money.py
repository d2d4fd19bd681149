"""Minor-unit normalisation with Decimal, by ISO 4217 exponent."""

from __future__ import annotations

from decimal import Decimal

import pytest

from webhooks.formats.money import InvalidPayload, currency, to_minor


@pytest.mark.parametrize(
    "value, code, major, expected",
    [
        (Decimal("100.50"), "NGN", True, 10050),
        ("100.5", "GHS", True, 10050),
        (100, "KES", True, 10000),
        (Decimal("0.01"), "ZAR", True, 1),
        (Decimal("1999.99"), "USD", True, 199999),
        (500, "JPY", True, 500),
        (Decimal("25000"), "UGX", True, 25000),
        (Decimal("1.234"), "KWD", True, 1234),
        (10050, "NGN", False, 10050),
        (Decimal("10050.0"), "NGN", False, 10050),
    ],
)
def test_amounts_become_integer_minor_units(value, code, major, expected):
    assert to_minor(value, code, major=major) == expected


@pytest.mark.parametrize(
    "value, code, major",
    [
        (Decimal("100.005"), "NGN", True),  # half a kobo
        (Decimal("500.5"), "JPY", True),  # yen has no minor unit
        (Decimal("10050.5"), "NGN", False),  # fractional minor amount
    ],
)
def test_fractional_minor_amount_is_invalid(value, code, major):
    with pytest.raises(InvalidPayload, match="whole number of minor units"):
        to_minor(value, code, major=major)


@pytest.mark.parametrize("value", [0, -100, True, None, "abc", "NaN", "Infinity", [1], 10**16])
def test_non_positive_or_non_numeric_amount_is_invalid(value):
    with pytest.raises(InvalidPayload):
        to_minor(value, "NGN", major=False)


def test_float_amounts_are_read_through_their_decimal_text():
    assert to_minor(0.29, "USD", major=True) == 29  # 0.29 * 100 == 28.999999999999996 in floats


@pytest.mark.parametrize("raw, expected", [("usd", "USD"), (" ngn ", "NGN"), ("GHS", "GHS")])
def test_currency_codes_are_upper_cased(raw, expected):
    assert currency(raw) == expected


@pytest.mark.parametrize("raw", [None, "", "US", "USDT", "566", 566, "u$d"])
def test_currency_must_be_three_letters(raw):
    with pytest.raises(InvalidPayload):
        currency(raw)
