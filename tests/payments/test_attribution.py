"""Which wallet a payment credits (docs/api.md "Payment attribution and recovery"): the merchant's
account from its metadata, else the payer's e-mail; a verified payment naming neither is kept
`unattributed` (200, never a 4xx that stops the provider's retries) until one assign credits
it; fees passed on, partial and over payments; refunds debit the wallet their payment
credited. Through the real app, Redis and database."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from testkit.payments import (
    METADATA_PATH,
    balance,
    counts,
    deliver,
    encode,
    payload,
    refund_payload,
    verdicts,
    with_metadata,
    without_payer,
)
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, Payment

# stripe/openapi, openapi/fixtures3.json, resources.payment_intent (the PaymentIntent that
# stripe-mock serves), field for field as published; only `status` and `amount_received` are
# set as `payment_intent.succeeded` carries them (the fixture is a requires_payment_method one).
STRIPE_FIXTURE_PAYMENT_INTENT = {
    "amount": 1099,
    "amount_capturable": 0,
    "amount_details": {"tip": {}},
    "amount_received": 0,
    "application": None,
    "application_fee_amount": None,
    "automatic_payment_methods": {"enabled": True},
    "canceled_at": 1234567890,
    "cancellation_reason": None,
    "capture_method": "automatic",
    "client_secret": "pi_1PgafyB7WZ01zgkWSjxsAJo3_secret_Dm43xiq1k0ywrRRjDoi8y1gkM",
    "confirmation_method": "automatic",
    "created": 1234567890,
    "currency": "usd",
    "customer": None,
    "description": None,
    "id": "pi_1PgafyB7WZ01zgkWSjxsAJo3",
    "last_payment_error": {"type": "idempotency_error"},
    "latest_charge": None,
    "livemode": False,
    "metadata": {},
    "next_action": {"type": "type"},
    "object": "payment_intent",
    "on_behalf_of": None,
    "payment_method": None,
    "payment_method_configuration_details": {"id": "obj_123", "parent": None},
    "payment_method_options": {},
    "payment_method_types": ["card"],
    "processing": {"type": "card"},
    "receipt_email": None,
    "review": None,
    "setup_future_usage": None,
    "shipping": {},
    "statement_descriptor": None,
    "statement_descriptor_suffix": None,
    "status": "requires_payment_method",
    "transfer_data": {"destination": {"id": "obj_123", "object": "account"}},
    "transfer_group": None,
    "source": None,
    "excluded_payment_method_types": None,
    "customer_account": None,
    "managed_payments": {"enabled": True},
}
REF = STRIPE_FIXTURE_PAYMENT_INTENT["id"]


def stripe_fixture_event() -> bytes:
    intent = {**STRIPE_FIXTURE_PAYMENT_INTENT, "status": "succeeded", "amount_received": 1099}
    event = {
        "id": "evt_fixture",
        "object": "event",
        "type": "payment_intent.succeeded",
        "api_version": None,
        "created": 1234567890,
        "livemode": False,
        "pending_webhooks": 0,
        "request": {"id": None, "idempotency_key": None},
        "data": {"object": intent},
    }
    return encode(event)


def assign(api, provider: str, reference: str, body) -> object:
    return api.http.post(
        f"{api.base}/v1/admin/payments/{provider}/{reference}/assign", json=body, headers=api.admin, timeout=30
    )


def test_stripes_own_fixture_payment_intent_is_kept_unattributed_listed_and_assigned_once(api):
    first = deliver(api, "stripe", stripe_fixture_event())
    assert (first.status_code, first.json()) == (200, {"status": "unattributed"})
    again = deliver(api, "stripe", stripe_fixture_event())
    assert (again.status_code, again.json()) == (200, {"status": "duplicate"})
    assert counts()["wallets"] == 0 and verdicts("stripe") == ["unattributed", "duplicate"]
    listed = api.get("/v1/admin/payments?status=unattributed").json()
    assert listed["count"] == 1
    (record,) = listed["payments"]
    assert (record["reference"], record["amount_minor"], record["currency"]) == (REF, 1099, "USD")
    assert (record["customer"], record["status"], record["credited_at"]) == (None, "unattributed", None)

    done = assign(api, "stripe", REF, {"customer": "acct_42"})
    assert done.status_code == 200, done.text
    assert (done.json()["status"], done.json()["customer"], done.json()["source"]) == ("credited", "acct_42", "webhook")
    assert balance("acct_42", "USD") == 1099
    assert api.get("/v1/admin/wallets/acct_42").json()["balances_minor"] == {"USD": 1099}
    second = assign(api, "stripe", REF, {"customer": "acct_43"})
    assert (second.status_code, second.json()["error"]["code"]) == (409, "already_assigned")
    assert api.get("/v1/admin/payments?status=unattributed").json() == {"payments": [], "count": 0}
    # the provider delivering it again after the assign is still a duplicate, not a conflict
    late = deliver(api, "stripe", stripe_fixture_event())
    assert (late.status_code, late.json()) == (200, {"status": "duplicate"})
    assert balance("acct_42", "USD") == 1099 and balance("acct_43", "USD") is None


def test_concurrent_assigns_credit_once(api):
    assert deliver(api, "stripe", stripe_fixture_event()).json() == {"status": "unattributed"}
    start = threading.Barrier(20)

    def one(i: int) -> int:
        start.wait()
        return assign(api, "stripe", REF, {"customer": f"acct_{i}"}).status_code

    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(one, range(20)))
    assert sorted(codes) == [200] + [409] * 19
    with db.connection_context():
        (payment,) = Payment.select()
        assert balance(payment.customer, "USD") == 1099
        assert AuditLog.select().where(AuditLog.action == "payment.assign").count() == 1
    assert counts()["wallets"] == 1


@pytest.mark.parametrize(
    "body, code",
    [({}, 400), ({"customer": ""}, 400), ({"customer": "a b"}, 400), ({"customer": "x" * 255}, 400), ([], 400)],
)
def test_an_assign_without_a_usable_wallet_is_refused_and_changes_nothing(api, body, code):
    deliver(api, "stripe", stripe_fixture_event())
    resp = assign(api, "stripe", REF, body)
    assert (resp.status_code, resp.json()["error"]["code"]) == (code, "invalid_assign")
    assert api.get("/v1/admin/payments?status=unattributed").json()["count"] == 1


def test_an_assign_of_an_unknown_or_credited_payment_is_404_or_409(api):
    assert assign(api, "stripe", "pi_nope", {"customer": "a"}).status_code == 404
    deliver(api, "paystack", encode(payload("paystack", "ps-att-1", 5000)))
    resp = assign(api, "paystack", "ps-att-1", {"customer": "acct_1"})
    assert (resp.status_code, resp.json()["error"]["code"]) == (409, "already_assigned")
    assert balance("ada@example.com", "NGN") == 5000 and balance("acct_1", "NGN") is None


@pytest.mark.parametrize("provider", sorted(METADATA_PATH))
def test_each_provider_credits_the_account_its_metadata_names(api, reconfigure, provider):
    reconfigure(payment_account_field="account_id")
    body = with_metadata(provider, payload(provider, f"{provider}-att-2", 120000), {"account_id": "user-77"})
    resp = deliver(api, provider, encode(body))
    assert resp.json() == {"status": "credited"}
    assert balance("user-77", "NGN") == 120000 and balance("ada@example.com", "NGN") is None
    plain = payload(provider, f"{provider}-att-3", 3000)  # no metadata key: the e-mail, as before
    assert deliver(api, provider, encode(plain)).json() == {"status": "credited"}
    assert balance("ada@example.com", "NGN") == 3000


@pytest.mark.parametrize("provider", ["paystack", "flutterwave", "monnify", "interswitch", "standard"])
def test_every_provider_keeps_a_payment_naming_no_wallet_instead_of_refusing_it(api, reconfigure, provider):
    reconfigure(payment_account_field="account_id")
    raw = encode(without_payer(provider, payload(provider, f"{provider}-att-4", 4200)))
    resp = deliver(api, provider, raw)
    assert (resp.status_code, resp.json()) == (200, {"status": "unattributed"})
    assert deliver(api, provider, raw).json() == {"status": "duplicate"}
    assert counts()["wallets"] == 0
    with db.connection_context():
        assert AuditLog.select().where(AuditLog.action == "payment.unattributed").count() == 1


def test_a_refund_debits_the_account_its_payment_credited(api, reconfigure):
    reconfigure(payment_account_field="account_id")
    body = with_metadata("paystack", payload("paystack", "ps-att-5", 10000), {"account_id": "user-9"})
    assert deliver(api, "paystack", encode(body)).json() == {"status": "credited"}
    refund = refund_payload("paystack", "rf-att-5", "ps-att-5", 4000)  # names the payer's e-mail
    resp = deliver(api, "paystack", encode(refund))
    assert (resp.status_code, resp.json()) == (200, {"status": "debited"}), resp.text
    assert balance("user-9", "NGN") == 6000 and balance("ada@example.com", "NGN") is None
    other = refund_payload("paystack", "rf-att-6", "ps-att-5", 1000, email="eve@example.com")
    assert deliver(api, "paystack", encode(other)).status_code == 422  # another payer: not this payment's
    assert balance("user-9", "NGN") == 6000


def test_a_refund_of_an_unattributed_payment_lowers_what_its_assign_credits(api):
    deliver(api, "standard", encode(without_payer("standard", payload("standard", "std-att-7", 5000))))
    refund = refund_payload("standard", "rf-att-7", "std-att-7", 2000)
    del refund["data"]["customer"]
    assert deliver(api, "standard", encode(refund)).json() == {"status": "debited"}
    assert counts()["wallets"] == 0
    done = assign(api, "standard", "std-att-7", {"customer": "Ada@Example.com"}).json()
    assert (done["status"], done["refunded_minor"], done["customer"]) == ("partially_refunded", 2000, "ada@example.com")
    assert balance("ada@example.com", "NGN") == 3000


def test_paystacks_fee_passed_on_is_recorded_not_credited(api):
    body = payload("paystack", "re4lyvq3s3", 40333)
    body["data"].update(requested_amount=30050, fees=10283)
    assert deliver(api, "paystack", encode(body)).json() == {"status": "credited"}
    record = api.get("/v1/admin/payments/paystack/re4lyvq3s3").json()
    assert (record["amount_minor"], record["fees_minor"], record["flag"]) == (30050, 10283, None)
    assert balance("ada@example.com", "NGN") == 30050


@pytest.mark.parametrize("status, flag", [("PARTIALLY_PAID", "partially_paid"), ("OVERPAID", "overpaid")])
def test_monnify_partial_and_over_payments_credit_the_money_received_and_are_flagged(api, status, flag):
    body = payload("monnify", "MNFY|att|8", 250000)
    body["eventData"].update(paymentStatus=status, totalPayable=3000)
    assert deliver(api, "monnify", encode(body)).json() == {"status": "credited"}
    record = api.get("/v1/admin/payments/monnify/MNFY%7Catt%7C8").json()
    assert (record["amount_minor"], record["flag"]) == (250000, flag)
    assert balance("ada@example.com", "NGN") == 250000
    with db.connection_context():
        assert AuditLog.select().where(AuditLog.action == f"payment.{flag}").count() == 1


def test_the_unattributed_listing_refuses_other_queries(api):
    assert api.get("/v1/admin/payments").status_code == 400
    assert api.get("/v1/admin/payments?status=credited").status_code == 400
    assert api.get("/v1/admin/payments?status=unattributed&limit=0").status_code == 400
