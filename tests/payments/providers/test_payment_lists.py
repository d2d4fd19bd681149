"""The reconciliation listers against a real local HTTP server playing the four providers' list
APIs (testkit/provider_apis.py): every page is read, each body parses as the provider's webhook,
and a page that is not whole raises ProviderError with nothing of it yielded."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from testkit import provider_apis as fake
from testkit.provider_apis import ProviderApis
from webhooks import config
from webhooks.config import PROVIDER_SECRETS
from webhooks.payments.providers import notifications, payment_lists
from webhooks.payments.providers.payment_lists import Page, ProviderError

NOW = datetime.now(timezone.utc)
SINCE, UNTIL = NOW - timedelta(days=3), NOW
PROVIDERS = ("paystack", "flutterwave", "monnify", "stripe")
PAGE_SIZE = 10  # Flutterwave's own; the others are asked for pages of this size here
KEYS = {
    "paystack": fake.PAYSTACK_KEY,
    "flutterwave": fake.FLUTTERWAVE_KEY,
    "monnify": fake.MONNIFY_SECRET,
    "stripe": fake.STRIPE_KEY,
}
# provider -> (the amount as the provider sends it, the minor units it means, currency given, parsed)
AMOUNTS: dict[str, tuple[Any, int, str, str]] = {
    "paystack": (40333, 40333, "NGN", "NGN"),
    "flutterwave": (Decimal("1234.56"), 123456, "NGN", "NGN"),
    "monnify": (Decimal("1500.50"), 150050, "NGN", "NGN"),
    "stripe": (1099, 1099, "usd", "USD"),
}


@pytest.fixture
def apis():
    with ProviderApis() as server:
        yield server


def settings(apis: ProviderApis, **overrides: Any) -> config.Config:
    """A Config naming the fake's URL and keys for every provider (overridable)."""
    return apis.config(**overrides)


def lister(apis: ProviderApis, provider: str, **overrides: Any) -> Any:
    """`provider`'s lister on the fake, unpaced, asking pages of PAGE_SIZE."""
    found = payment_lists.listers(settings(apis, **overrides))[provider]
    found.min_interval_s = 0
    for size in ("per_page", "size", "limit"):
        if hasattr(found, size):
            setattr(found, size, PAGE_SIZE)
    return found


def add_payments(apis: ProviderApis, provider: str, n: int) -> list[dict]:
    """`n` payments of AMOUNTS[provider], references {provider}-ref-000..., one payer each."""
    amount, _minor, currency, _code = AMOUNTS[provider]
    return [
        apis.add(
            provider, f"{provider}-ref-{i:03}", amount, f"Payer{i}@Example.com", {"wallet": f"w{i}"}, currency=currency
        )
        for i in range(n)
    ]


def parsed(provider: str, page: Page) -> list[notifications.PaymentNotification]:
    found = [notifications.parse(provider, body) for body in page.bodies]
    assert all(isinstance(e, notifications.PaymentNotification) and e.succeeded for e in found)
    return found


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_page_is_listed_and_each_body_parses_as_the_providers_webhook(apis, provider):
    add_payments(apis, provider, 25)
    pages = list(lister(apis, provider).pages(SINCE, UNTIL))
    assert [p.number for p in pages] == [1, 2, 3]
    assert [len(p.bodies) for p in pages] == [10, 10, 5]
    got = [e for p in pages for e in parsed(provider, p)]
    _amount, minor, _currency, code = AMOUNTS[provider]
    assert sorted((e.reference, e.amount_minor, e.currency, e.customer) for e in got) == [
        (f"{provider}-ref-{i:03}", minor, code, f"payer{i}@example.com") for i in range(25)
    ]
    assert apis.calls[fake.PATHS[provider]] == 3


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_empty_listing_is_one_page_with_no_bodies(apis, provider):
    assert [(p.number, p.bodies) for p in lister(apis, provider).pages(SINCE, UNTIL)] == [(1, [])]


def test_a_paystack_body_is_the_list_item_whole_under_charge_success(apis):
    item = apis.add(
        "paystack", "re4lyvq3s3", 40333, "demo@test.com", {"cart_id": "IU929"}, fees=10283, requested_amount=30050
    )
    (page,) = lister(apis, "paystack").pages(SINCE, UNTIL)
    assert json.loads(page.bodies[0]) == {"event": "charge.success", "data": item}


def test_a_monnify_body_maps_the_search_item_to_the_webhooks_field_names(apis):
    item = apis.add("monnify", "MNFY|04|20211117112842|000170", Decimal("3000"), "test@tester.com", {"wallet": "w9"})
    (page,) = lister(apis, "monnify").pages(SINCE, UNTIL)
    assert json.loads(page.bodies[0]) == {
        "eventType": "SUCCESSFUL_TRANSACTION",
        "eventData": {
            "transactionReference": "MNFY|04|20211117112842|000170",
            "paymentReference": item["paymentReference"],
            "amountPaid": 3000.0,
            "totalPayable": 3000.0,
            "currency": "NGN",
            "paymentStatus": "PAID",
            "customer": item["customerDTO"],
            "metaData": {"wallet": "w9"},
        },
    }


def test_amounts_stay_exact_decimals_from_the_page_to_the_body(apis):
    apis.add("flutterwave", "flw-1", Decimal("0.1"), "ada@example.com")
    (page,) = lister(apis, "flutterwave").pages(SINCE, UNTIL)
    assert b'"amount":0.1,' in page.bodies[0] and b'"app_fee":1.4' in page.bodies[0]
    assert notifications.parse("flutterwave", page.bodies[0]).amount_minor == 10


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_gzipped_page_is_read_decoded(apis, provider):
    apis.gzip = True
    add_payments(apis, provider, 3)
    (page,) = lister(apis, provider).pages(SINCE, UNTIL)
    assert len(parsed(provider, page)) == 3


def test_a_gzipped_page_is_capped_at_its_inflated_size(apis):
    apis.gzip = True
    add_payments(apis, "paystack", 10)  # under 1 kB gzipped, 8.5 kB inflated
    paystack = lister(apis, "paystack")
    paystack.max_bytes = 6_000
    with pytest.raises(ProviderError, match="over the 6000-byte cap"):
        list(paystack.pages(SINCE, UNTIL))


def test_flutterwave_reads_the_payer_from_customer_email_when_the_item_has_no_customer(apis):
    apis.add("flutterwave", "flw-flat", 2500, "Flat@Example.com", email_as="customer_email")
    (page,) = lister(apis, "flutterwave").pages(SINCE, UNTIL)
    assert notifications.parse("flutterwave", page.bodies[0]).customer == "flat@example.com"


def test_payments_that_did_not_succeed_are_skipped(apis):
    # the fake ignores Flutterwave's unconfirmed `status` filter, as Flutterwave may
    apis.add("flutterwave", "flw-pending", 2500, "a@example.com", status="pending")
    apis.add("flutterwave", "flw-failed", 2500, "a@example.com", status="failed")
    apis.add("flutterwave", "flw-ok", 2500, "a@example.com")
    (page,) = lister(apis, "flutterwave").pages(SINCE, UNTIL)
    assert [e.reference for e in parsed("flutterwave", page)] == ["flw-ok"]


def test_each_provider_is_asked_for_successful_payments_in_the_window(apis):
    for provider in PROVIDERS:
        list(lister(apis, provider).pages(SINCE, UNTIL))
    (paystack,) = apis.requests_to("/transaction")
    assert paystack.query["status"] == "success" and paystack.query["perPage"] == "10"
    assert paystack.query["from"] == SINCE.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    (flutterwave,) = apis.requests_to("/v3/transactions")
    assert flutterwave.query["status"] == "successful"
    (monnify,) = apis.requests_to("/api/v1/transactions/search")
    assert monnify.query["paymentStatus"] == "PAID" and monnify.query["page"] == "0"
    assert monnify.query["to"] == str(int(UNTIL.timestamp() * 1000))
    (stripe,) = apis.requests_to("/v1/events")
    assert stripe.query["type"] == "payment_intent.succeeded" and stripe.query["delivery_success"] == "false"
    assert stripe.query["created[lte]"] == str(int(UNTIL.timestamp()))


def test_flutterwave_keeps_payments_of_the_whole_days_around_the_window(apis):
    apis.add("flutterwave", "flw-inside", 100, "a@example.com", at=SINCE + timedelta(hours=1))
    apis.add("flutterwave", "flw-hour-before", 100, "a@example.com", at=SINCE - timedelta(hours=1))
    apis.add("flutterwave", "flw-week-before", 100, "a@example.com", at=SINCE - timedelta(days=7))
    (page,) = lister(apis, "flutterwave").pages(SINCE, UNTIL)
    assert sorted(e.reference for e in parsed("flutterwave", page)) == ["flw-hour-before", "flw-inside"]
    (seen,) = apis.requests_to("/v3/transactions")
    assert seen.query["from"] == (SINCE - timedelta(days=1)).date().isoformat()
    assert seen.query["to"] == (UNTIL + timedelta(days=1)).date().isoformat()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_payments_outside_the_window_are_not_listed(apis, provider):
    amount, _minor, currency, _code = AMOUNTS[provider]
    apis.add(provider, "old", amount, "a@example.com", currency=currency, at=SINCE - timedelta(days=5))
    apis.add(provider, "new", amount, "a@example.com", currency=currency, at=SINCE + timedelta(hours=1))
    (page,) = lister(apis, provider).pages(SINCE, UNTIL)
    assert [e.reference for e in parsed(provider, page)] == ["new"]


# fault kind -> what the error says (an envelope out of shape: each provider says which part)
REASONS = {
    "500": "answered HTTP 500",
    "429": "rate limited (429)",
    "truncated": "unreadable JSON",
    "dropped": "no complete answer",
    "bad_json": "unreadable JSON",
    "bad_envelope": "",
}


@pytest.mark.parametrize("kind", REASONS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_bad_page_2_raises_after_page_1_was_yielded_whole(apis, provider, kind):
    add_payments(apis, provider, 25)
    apis.fail(provider, page=2, kind=kind)
    listing = lister(apis, provider).pages(SINCE, UNTIL)
    first = next(listing)
    assert first.number == 1 and len(parsed(provider, first)) == 10
    with pytest.raises(ProviderError) as caught:
        next(listing)
    error = caught.value
    assert (error.provider, error.page) == (provider, 2)
    assert str(error).startswith(f"{provider} page 2: ") and REASONS[kind] in error.reason
    assert error.status == (int(kind) if kind.isdigit() else None)
    assert KEYS[provider] not in str(error)


def test_a_failed_listing_is_whole_on_the_next_run(apis):
    add_payments(apis, "paystack", 25)
    apis.fail("paystack", page=3, kind="500", once=True)
    with pytest.raises(ProviderError, match="answered HTTP 500"):
        list(lister(apis, "paystack").pages(SINCE, UNTIL))
    assert sum(len(p.bodies) for p in lister(apis, "paystack").pages(SINCE, UNTIL)) == 25


@pytest.mark.parametrize("provider", PROVIDERS)
def test_wrong_credentials_are_refused_without_naming_them(apis, provider):
    add_payments(apis, provider, 3)
    wrong = {
        "paystack": {"secrets": {"paystack": ("sk_test_wrong",)}},
        "flutterwave": {"flutterwave_secret_key": "FLWSECK_TEST-wrong-X"},
        "monnify": {"secrets": {"monnify": ("wrong-client-secret",)}},
        "stripe": {"stripe_api_key": "sk_test_wrong"},
    }[provider]
    with pytest.raises(ProviderError) as caught:
        list(lister(apis, provider, **wrong).pages(SINCE, UNTIL))
    assert caught.value.status == 401 and "refused (401)" in str(caught.value)
    assert "NOT_THE_KEY" not in str(caught.value)


def test_monnify_logs_in_once_per_listing(apis):
    add_payments(apis, "monnify", 25)
    monnify = lister(apis, "monnify")
    pages = list(monnify.pages(SINCE, UNTIL))
    assert [p.calls for p in pages] == [2, 1, 1]  # the login counts on page 1
    assert apis.calls[fake.LOGIN] == 1
    searches = apis.requests_to("/api/v1/transactions/search")
    assert [s.query["page"] for s in searches] == ["0", "1", "2"]
    assert len({s.authorization for s in searches}) == 1
    list(monnify.pages(SINCE, UNTIL))
    assert apis.calls[fake.LOGIN] == 2


def test_monnify_logs_in_once_more_when_its_token_is_refused_mid_listing(apis):
    add_payments(apis, "monnify", 25)
    listing = lister(apis, "monnify").pages(SINCE, UNTIL)
    next(listing)
    apis.expire_tokens()
    rest = list(listing)
    assert [(p.number, p.calls, len(p.bodies)) for p in rest] == [(2, 3, 10), (3, 1, 5)]
    assert apis.calls[fake.LOGIN] == 2


def test_monnify_token_refused_again_after_the_second_login_raises(apis):
    add_payments(apis, "monnify", 25)
    apis.fail("monnify", page=2, kind="401")
    listing = lister(apis, "monnify").pages(SINCE, UNTIL)
    next(listing)
    with pytest.raises(ProviderError, match="refused"):
        next(listing)
    assert apis.calls[fake.LOGIN] == 2


def test_stripe_pages_on_starting_after_the_last_event_of_each_page(apis):
    add_payments(apis, "stripe", 25)
    pages = list(lister(apis, "stripe").pages(SINCE, UNTIL))
    seen = apis.requests_to("/v1/events")
    lasts = [json.loads(p.bodies[-1])["id"] for p in pages]
    assert [s.query.get("starting_after") for s in seen] == [None, lasts[0], lasts[1]]
    assert [s.query["limit"] for s in seen] == ["10", "10", "10"]
    assert len({json.loads(b)["id"] for p in pages for b in p.bodies}) == 25


def test_stripe_lists_only_events_not_yet_delivered(apis):
    delivered = apis.add("stripe", "pi_delivered", 500, "a@example.com", currency="usd")
    apis.add("stripe", "pi_missed", 500, "a@example.com", currency="usd")
    apis.stripe_delivered.add(delivered["id"])
    (page,) = lister(apis, "stripe").pages(SINCE, UNTIL)
    assert [e.reference for e in parsed("stripe", page)] == ["pi_missed"]


def test_stripe_is_not_asked_past_its_30_days_of_events(apis):
    list(lister(apis, "stripe").pages(NOW - timedelta(days=45), UNTIL))
    (seen,) = apis.requests_to("/v1/events")
    assert int(seen.query["created[gte]"]) >= int((NOW - timedelta(days=30)).timestamp())


def test_a_listing_longer_than_the_page_limit_is_refused(apis):
    add_payments(apis, "paystack", 25)
    paystack = lister(apis, "paystack")
    paystack.max_pages = 2
    listing = paystack.pages(SINCE, UNTIL)
    assert [next(listing).number, next(listing).number] == [1, 2]
    with pytest.raises(ProviderError, match="more than 2 pages"):
        next(listing)
    assert apis.calls["/transaction"] == 2


def test_a_page_over_the_size_cap_is_refused(apis):
    add_payments(apis, "paystack", 5)
    paystack = lister(apis, "paystack")
    paystack.max_bytes = 2_000
    with pytest.raises(ProviderError, match="cap"):
        list(paystack.pages(SINCE, UNTIL))


def test_a_page_not_read_within_its_deadline_is_refused(apis):
    add_payments(apis, "stripe", 5)
    apis.fail("stripe", page=1, kind="trickle")  # about a second to send
    stripe = lister(apis, "stripe")
    stripe.deadline_s = 0.2
    with pytest.raises(ProviderError, match=r"no complete answer \(timeout\)"):
        list(stripe.pages(SINCE, UNTIL))


def test_an_unreachable_provider_is_a_provider_error(apis):
    apis.close()
    with pytest.raises(ProviderError, match="no complete answer"):
        list(lister(apis, "flutterwave").pages(SINCE, UNTIL))


def test_naive_datetimes_are_refused(apis):
    with pytest.raises(ValueError):
        list(lister(apis, "paystack").pages(SINCE.replace(tzinfo=None), UNTIL))


def test_pacing_stays_under_each_providers_documented_rate_limit(apis):
    found = payment_lists.listers(settings(apis))
    assert {p: found[p].min_interval_s for p in PROVIDERS} == {
        "paystack": 0.1,  # 600 / 60 s live
        "flutterwave": 0.2,  # no number published
        "monnify": 0.2,  # no number published
        "stripe": 0.04,  # 25 / s per endpoint
    }


def test_listers_are_the_configured_providers_and_unconfigured_says_why_of_the_rest(apis):
    assert payment_lists.listers(config.load({})) == {}
    assert payment_lists.unconfigured(config.load({})) == {
        "paystack": "PAYSTACK_SECRET_KEY unset",
        "flutterwave": "FLUTTERWAVE_SECRET_KEY unset",
        "monnify": "MONNIFY_API_KEY and MONNIFY_CLIENT_SECRET unset",
        "stripe": "STRIPE_API_KEY unset",
        "interswitch": payment_lists.INTERSWITCH,
        "standard": payment_lists.STANDARD,
    }
    assert "no list API" in payment_lists.INTERSWITCH

    partly = config.load({"PAYSTACK_SECRET_KEY": "sk_a sk_b", "MONNIFY_CLIENT_SECRET": "s", "STRIPE_API_KEY": "sk"})
    assert set(payment_lists.listers(partly)) == {"paystack", "stripe"}
    assert payment_lists.unconfigured(partly)["monnify"] == "MONNIFY_API_KEY unset"

    every = settings(apis)
    assert set(payment_lists.listers(every)) == set(PROVIDERS)
    assert set(payment_lists.unconfigured(every)) == {"interswitch", "standard"}
    for cfg in (config.load({}), partly, every):
        assert set(payment_lists.listers(cfg)).isdisjoint(payment_lists.unconfigured(cfg))
        assert set(payment_lists.listers(cfg)) | set(payment_lists.unconfigured(cfg)) == set(PROVIDER_SECRETS)


def test_paystack_authenticates_with_the_first_secret_while_it_is_rotated(apis):
    paystack = lister(apis, "paystack", secrets={"paystack": (fake.PAYSTACK_KEY, "sk_test_next")})
    list(paystack.pages(SINCE, UNTIL))
    assert apis.requests_to("/transaction")[0].authorization == f"Bearer {fake.PAYSTACK_KEY}"
