"""Provider payloads to PaymentNotification: the docs/api.md table, on the providers' documented samples."""

from __future__ import annotations

import pytest

from testkit.payments import METADATA_PATH, PROVIDERS, encode, payload, with_metadata, without_payer
from webhooks.errors import InvalidJSON
from webhooks.formats.money import InvalidPayload
from webhooks.payments.providers.notifications import parse


@pytest.mark.parametrize("provider", PROVIDERS)
def test_success_event_gives_reference_minor_amount_currency_and_payer(provider):
    note = parse(provider, encode(payload(provider, "ref-42", 123456, "GHS", "Ada@Example.COM")))
    assert note.succeeded
    assert (note.reference, note.amount_minor, note.currency, note.customer) == (
        "ref-42",
        123456,
        "GHS",
        "ada@example.com",
    )


@pytest.mark.parametrize("provider", PROVIDERS)
def test_failed_charge_is_a_valid_event_that_credits_nothing(provider):
    note = parse(provider, encode(payload(provider, "ref-43", 500, success=False)))
    assert not note.succeeded and note.amount_minor is None


@pytest.mark.parametrize("provider", ["flutterwave", "monnify"])
def test_major_unit_providers_are_scaled_by_the_currency_exponent(provider):
    assert parse(provider, encode(payload(provider, "r", 5000, "JPY"))).amount_minor == 5000
    assert parse(provider, encode(payload(provider, "r", 5000, "NGN"))).amount_minor == 5000


def test_documented_paystack_sample_reads_as_api_md_says():
    note = parse("paystack", encode(payload("paystack", "qTPrJoy9Bx", 10000, email="bojack@horseman.com")))
    assert (note.event_type, note.reference, note.amount_minor) == ("charge.success", "qTPrJoy9Bx", 10000)


def test_monnify_references_keep_their_pipes():
    note = parse("monnify", encode(payload("monnify", "MNFY|76|20211117154810|000001", 7800000)))
    assert note.reference == "MNFY|76|20211117154810|000001" and note.amount_minor == 7800000


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


@pytest.mark.parametrize("field", ["reference", "amount", "currency"])
def test_success_without_reference_amount_or_currency_is_invalid(field):
    body = payload("paystack", "ref-44", 100)
    del body["data"][field]
    with pytest.raises(InvalidPayload):
        parse("paystack", encode(body))


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("email", [None, "", "not an e-mail", 42])
def test_a_success_naming_no_usable_payer_is_unattributed_not_refused(provider, email):
    body = without_payer(provider, payload(provider, "ref-46", 700))
    if email is not None:
        body = payload(provider, "ref-46", 700, email=email)
    note = parse(provider, encode(body), "account_id")
    assert note.succeeded and note.customer is None and note.payer is None
    assert (note.reference, note.amount_minor) == ("ref-46", 700)


@pytest.mark.parametrize("provider", sorted(METADATA_PATH))
def test_the_merchants_account_in_metadata_names_the_wallet_before_the_email(provider):
    body = with_metadata(provider, payload(provider, "ref-47", 900), {"account_id": "acct_42", "x": 1})
    note = parse(provider, encode(body), "account_id")
    assert (note.customer, note.payer) == ("acct_42", "ada@example.com")
    assert parse(provider, encode(body)).customer == "ada@example.com"  # PAYMENT_ACCOUNT_FIELD unset
    assert parse(provider, encode(body), "user_id").customer == "ada@example.com"  # another key


@pytest.mark.parametrize(
    "metadata, wallet",
    [
        ('{"account_id": "acct_7"}', "acct_7"),  # Paystack: stringified JSON, as given to it
        ({"account_id": 1234}, "1234"),
        ({"account_id": "  acct_8 "}, "acct_8"),
        ({"account_id": "a b"}, "ada@example.com"),
        ({"account_id": "x" * 255}, "ada@example.com"),
        ({"account_id": "acct\n9"}, "ada@example.com"),
        ({"account_id": None}, "ada@example.com"),
        ({"account_id": True}, "ada@example.com"),
        ({"account_id": ["acct_1"]}, "ada@example.com"),
        ("", "ada@example.com"),  # Paystack's own samples: "", 0 and null
        (0, "ada@example.com"),
        (None, "ada@example.com"),
        ('{"account_id": ', "ada@example.com"),
        ('{"account_id": "a", "account_id": "b"}', "ada@example.com"),
        ("[" * 100_000, "ada@example.com"),
    ],
)
def test_metadata_in_every_shape_paystack_sends_it(metadata, wallet):
    body = with_metadata("paystack", payload("paystack", "ref-48", 900), metadata)
    assert parse("paystack", encode(body), "account_id").customer == wallet


def test_an_account_with_an_at_sign_is_a_lower_cased_email_wallet():
    body = with_metadata("stripe", payload("stripe", "pi_48", 900), {"account_id": "Bob@Example.COM"})
    assert parse("stripe", encode(body), "account_id").customer == "bob@example.com"


def test_paystack_credits_the_amount_requested_when_the_fee_was_passed_on():
    """Paystack's own transaction sample (PaystackOSS/doc-code-snippets, src/api/transactions/
    verify/response.json): amount 40333 = requested_amount 30050 + fees 10283."""
    body = payload("paystack", "re4lyvq3s3", 40333)
    body["data"].update(requested_amount=30050, fees=10283)
    note = parse("paystack", encode(body))
    assert (note.amount_minor, note.fees_minor) == (30050, 10283)
    body["data"].update(requested_amount=40333, fees=605)  # the merchant bore the fee
    assert (parse("paystack", encode(body)).amount_minor, parse("paystack", encode(body)).fees_minor) == (40333, 0)
    body["data"]["requested_amount"] = "30050.5"
    with pytest.raises(InvalidPayload):
        parse("paystack", encode(body))


@pytest.mark.parametrize(
    "status, flag", [("PAID", None), ("PARTIALLY_PAID", "partially_paid"), ("OVERPAID", "overpaid")]
)
def test_monnify_partial_and_over_payments_credit_what_was_received_and_are_flagged(status, flag):
    body = payload("monnify", "MNFY|1", 250000)  # amountPaid 2500.00 naira
    body["eventData"].update(paymentStatus=status, totalPayable=3000)
    note = parse("monnify", encode(body))
    assert note.succeeded and (note.amount_minor, note.flag) == (250000, flag)


@pytest.mark.parametrize("status", ["PENDING", "FAILED", "REVERSED", "EXPIRED"])
def test_monnify_statuses_without_money_received_credit_nothing(status):
    body = payload("monnify", "MNFY|2", 250000)
    body["eventData"]["paymentStatus"] = status
    assert not parse("monnify", encode(body)).succeeded


@pytest.mark.parametrize(
    "currency, sent, minor",
    [
        ("USD", 2000, 2000),
        ("JPY", 500, 500),  # zero-decimal for Stripe and ISO 4217
        ("MGA", 500, 50000),  # zero-decimal for Stripe, two decimals in ISO 4217
        ("ISK", 10000, 100),  # two decimals for Stripe (multiples of 100), none in ISO 4217
        ("KWD", 5120, 5120),  # three decimals for both
        ("HUF", 150000, 150000),
    ],
)
def test_stripe_amounts_follow_stripes_own_currency_decimals(currency, sent, minor):
    assert parse("stripe", encode(payload("stripe", "pi_c", sent, currency))).amount_minor == minor


def test_a_stripe_isk_amount_that_is_no_whole_krona_is_invalid():
    with pytest.raises(InvalidPayload, match="minor units"):
        parse("stripe", encode(payload("stripe", "pi_i", 150, "ISK")))


def test_fractional_kobo_from_a_minor_unit_provider_is_invalid():
    body = payload("paystack", "ref-45", 100)
    raw = encode(body).replace(b'"amount":100', b'"amount":100.5')
    with pytest.raises(InvalidPayload, match="minor units"):
        parse("paystack", raw)
