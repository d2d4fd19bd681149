"""Provider payloads to PaymentEvent: the API.md table, on the providers' documented samples."""

from __future__ import annotations

import pytest

from testkit.payments import PROVIDERS, encode, payload
from webhooks.errors import InvalidJSON
from webhooks.payments.events import parse
from webhooks.payments.money import InvalidPayload


@pytest.mark.parametrize("provider", PROVIDERS)
def test_success_event_gives_reference_minor_amount_currency_and_payer(provider):
    event = parse(provider, encode(payload(provider, "ref-42", 123456, "GHS", "Ada@Example.COM")))
    assert event.succeeded
    assert (event.reference, event.amount_minor, event.currency, event.customer) == (
        "ref-42",
        123456,
        "GHS",
        "ada@example.com",
    )


@pytest.mark.parametrize("provider", PROVIDERS)
def test_failed_charge_is_a_valid_event_that_credits_nothing(provider):
    event = parse(provider, encode(payload(provider, "ref-43", 500, success=False)))
    assert not event.succeeded and event.amount_minor is None


@pytest.mark.parametrize("provider", ["flutterwave", "monnify"])
def test_major_unit_providers_are_scaled_by_the_currency_exponent(provider):
    assert parse(provider, encode(payload(provider, "r", 5000, "JPY"))).amount_minor == 5000
    assert parse(provider, encode(payload(provider, "r", 5000, "NGN"))).amount_minor == 5000


def test_documented_paystack_sample_reads_as_api_md_says():
    event = parse("paystack", encode(payload("paystack", "qTPrJoy9Bx", 10000, email="bojack@horseman.com")))
    assert (event.event_type, event.reference, event.amount_minor) == ("charge.success", "qTPrJoy9Bx", 10000)


def test_monnify_references_keep_their_pipes():
    event = parse("monnify", encode(payload("monnify", "MNFY|76|20211117154810|000001", 7800000)))
    assert event.reference == "MNFY|76|20211117154810|000001" and event.amount_minor == 7800000


def test_stripe_currency_is_upper_cased():
    assert parse("stripe", encode(payload("stripe", "pi_1", 2000, "USD"))).currency == "USD"


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b'"text"', b'{"event": '])
def test_unparseable_body_is_invalid_payload(raw):
    with pytest.raises(InvalidPayload):
        parse("paystack", raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"event": NaN}',
        b"\xff\xfe",
        b'{"event": "a", "event": "charge.success"}',
        b'{"data": {"amount": 1e999}}',
        b'{"d": ' * 65 + b"1" + b"}" * 65,
    ],
)
def test_json_the_strict_rules_refuse_is_invalid_json(raw):
    with pytest.raises(InvalidJSON):
        parse("paystack", raw)


@pytest.mark.parametrize("field", ["reference", "amount", "currency", "customer"])
def test_success_without_reference_amount_currency_or_payer_is_invalid(field):
    body = payload("paystack", "ref-44", 100)
    del body["data"][field]
    with pytest.raises(InvalidPayload):
        parse("paystack", encode(body))


def test_fractional_kobo_from_a_minor_unit_provider_is_invalid():
    body = payload("paystack", "ref-45", 100)
    raw = encode(body).replace(b'"amount":100', b'"amount":100.5')
    with pytest.raises(InvalidPayload, match="minor units"):
        parse("paystack", raw)
