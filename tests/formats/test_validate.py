"""Decimal strings are ASCII digits with at most two decimals (docs/api.md, Conventions), for admin
prices and budgets and for provider amounts alike; currencies come from the ISO 4217 list."""

from __future__ import annotations

import pytest

from testkit.payments import balance, counts, deliver, encode, payload
from webhooks.formats.money import InvalidPayload, currency, to_minor

NOT_ASCII_DECIMALS = ["1_0.00", "１２.50", "١٢", " 12.50", "12.50\n", "1e2", "+12", "12.", ".5", "0x10"]


@pytest.mark.parametrize("text", NOT_ASCII_DECIMALS)
def test_buyer_price_and_budget_must_be_ascii_decimal_strings(api, text):
    for field, body in (("price", {"price": text}), ("caps.daily_budget", {"caps": {"daily_budget": text}})):
        resp = api.http.put(
            f"{api.base}/v1/admin/buyers/acme",
            headers=api.admin,
            json={"name": "Acme", "endpoint_url": "http://127.0.0.1:9/acme", "price": "1.00", **body},
        )
        assert resp.status_code == 400, (field, text, resp.text)
        err = resp.json()["error"]
        assert err["code"] == "invalid_buyer" and err["message"].startswith(field + ":"), err
    assert api.get("/v1/admin/buyers/acme").status_code == 404


@pytest.mark.parametrize("text", ["1_0", "１０", "١٠"])
def test_publisher_commission_must_be_an_ascii_decimal_string(api, text):
    resp = api.http.put(
        f"{api.base}/v1/admin/publishers/surge",
        headers=api.admin,
        json={"name": "Surge", "api_key": "pk_live_abcdefghijkl", "commission_pct": text},
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_publisher", resp.text


def test_two_decimals_and_plain_numbers_are_still_accepted(api):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/acme",
        headers=api.admin,
        json={
            "name": "Acme",
            "endpoint_url": "http://127.0.0.1:9/acme",
            "price": "12.5",
            "caps": {"daily_budget": 900},
        },
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["price"] == "12.50" and resp.json()["caps"]["daily_budget"] == "900.00"
    bad = api.http.put(
        f"{api.base}/v1/admin/buyers/acme",
        headers=api.admin,
        json={"name": "Acme", "endpoint_url": "http://127.0.0.1:9/acme", "price": "12.505"},
    )
    assert bad.status_code == 400 and "two decimal places" in bad.json()["error"]["message"]


@pytest.mark.parametrize(
    "provider, amount",
    [
        ("paystack", "1_000"),
        ("paystack", "１０００"),
        ("flutterwave", "1_0.00"),
        ("monnify", "١٠"),
        ("interswitch", " 1000"),
        ("flutterwave", "1e3"),
    ],
)
def test_signed_provider_amount_that_is_no_ascii_decimal_string_credits_nothing(api, provider, amount):
    body = payload(provider, f"{provider}-odd-amount", 100000)
    if provider == "monnify":
        body["eventData"]["amountPaid"] = amount
    else:
        body["data"]["amount"] = amount
    resp = deliver(api, provider, encode(body))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_payload"
    assert counts()["payments"] == 0 and balance("ada@example.com", "NGN") is None


@pytest.mark.parametrize("code", ["ABC", "XXX", "XTS", "XAU", "QQQ"])
def test_signed_payment_in_a_code_outside_iso_4217_credits_nothing(api, code):
    resp = deliver(api, "paystack", encode(payload("paystack", "ps-odd-currency", 5000, currency=code)))
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_payload", resp.text
    assert counts()["payments"] == 0


def test_provider_decimal_strings_in_ascii_digits_are_read():
    assert to_minor("100.50", "NGN", major=True) == 10050
    assert to_minor("1.234", "KWD", major=True) == 1234
    assert to_minor("10050", "NGN", major=False) == 10050
    for text in ("1_000", "١٠٠", "１００", " 100", "100 ", "1e3", "-100", "+100"):
        with pytest.raises(InvalidPayload):
            to_minor(text, "NGN", major=False)


def test_currencies_are_iso_4217_codes():
    assert currency("ngn") == "NGN" and currency("ZWG") == "ZWG" and currency("XOF") == "XOF"
    for code in ("ABC", "XXX", "XTS", "XAU", "EURO", "ÉUR"):
        with pytest.raises(InvalidPayload):
            currency(code)
