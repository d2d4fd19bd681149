"""Refunds and reversals (docs/api.md "Refunds and reversals"): each debits its payer's wallet exactly
once per refund reference, the refunds of a payment never pass it, and a refund that arrives
before its payment waits for it. Real Redis and database, the app in this process."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from testkit.payments import REFUND_PROVIDERS, balance, deliver, encode, payload, refund_payload, verdicts
from webhooks import services
from webhooks.payments.providers.notifications import REFUND_SPECS, PaymentNotification, RefundNotification, parse
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, Payment, Refund, Wallet


def pay(api, provider: str, reference: str, amount: int, currency: str = "NGN", email: str = "ada@example.com"):
    resp = deliver(api, provider, encode(payload(provider, reference, amount, currency, email)))
    assert resp.status_code == 200 and resp.json()["status"] == "credited", resp.text
    return resp


def refund(
    api,
    provider: str,
    reference: str,
    payment_reference: str,
    amount: int,
    currency: str = "NGN",
    email: str = "ada@example.com",
    session=None,
):
    return deliver(
        api,
        provider,
        encode(refund_payload(provider, reference, payment_reference, amount, currency, email)),
        session=session,
    )


def until_answered(api, provider: str, raw: bytes):
    """Deliver as a provider does: a 409 `in_flight` is delivered again until it is answered."""
    session = api.session()
    while True:
        resp = deliver(api, provider, raw, session=session)
        if resp.status_code != 409 or resp.json().get("status") != "in_flight":
            return resp


def payment(api, provider: str, reference: str) -> dict:
    resp = api.get(f"/v1/admin/payments/{provider}/{reference}")
    assert resp.status_code == 200, resp.text
    return resp.json()


def audit(action: str) -> list[AuditLog]:
    with db.connection_context():
        return list(AuditLog.select().where(AuditLog.action == action))


@pytest.mark.parametrize("provider", REFUND_PROVIDERS)
def test_refunds_debit_the_wallet_and_show_on_the_payment(api, provider):
    pay(api, provider, "pay-1", 10_000)
    first = refund(api, provider, "rf-1", "pay-1", 2_500)
    assert (first.status_code, first.json()) == (200, {"status": "debited"})
    assert balance("ada@example.com", "NGN") == 7_500
    shown = payment(api, provider, "pay-1")
    assert (shown["refunded_minor"], shown["status"], shown["amount_minor"]) == (2_500, "partially_refunded", 10_000)

    assert refund(api, provider, "rf-2", "pay-1", 7_500).json() == {"status": "debited"}
    assert balance("ada@example.com", "NGN") == 0
    assert (payment(api, provider, "pay-1")["refunded_minor"], payment(api, provider, "pay-1")["status"]) == (
        10_000,
        "refunded",
    )
    assert refund(api, provider, "rf-2", "pay-1", 7_500).json() == {"status": "duplicate"}
    assert verdicts(provider, "rf-2") == ["debited", "duplicate"]


def test_five_concurrent_webhook_calls_of_one_refund_debit_once(api):
    pay(api, "paystack", "ps-conc", 50_000)
    raw = encode(refund_payload("paystack", "rf-conc", "ps-conc", 20_000))
    start = threading.Barrier(5)

    def one(_i: int) -> tuple[int, str]:
        start.wait()
        resp = until_answered(api, "paystack", raw)
        return resp.status_code, resp.json()["status"]

    with ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(one, range(5)))
    assert sorted(answers) == [(200, "debited")] + [(200, "duplicate")] * 4
    assert balance("ada@example.com", "NGN") == 30_000
    with db.connection_context():
        assert Refund.select().count() == 1
        assert Payment.get(Payment.reference == "ps-conc").refunded_minor == 20_000


def test_concurrent_refunds_of_one_payment_never_pass_it(api):
    pay(api, "stripe", "pi_conc", 10_000, "USD", "jenny@example.com")
    raws = [encode(refund_payload("stripe", f"re_{i}", "pi_conc", 3_000, "USD")) for i in range(10)]
    start = threading.Barrier(len(raws))

    def one(raw: bytes):
        start.wait()
        resp = until_answered(api, "stripe", raw)
        body = resp.json()
        return resp.status_code, body.get("status") or body["error"]["code"]

    with ThreadPoolExecutor(len(raws)) as pool:
        answers = Counter(pool.map(one, raws))
    assert answers == {(200, "debited"): 3, (422, "refund_exceeds_payment"): 7}
    shown = payment(api, "stripe", "pi_conc")
    assert (shown["refunded_minor"], shown["status"]) == (9_000, "partially_refunded")
    assert balance("jenny@example.com", "USD") == 1_000
    assert len(audit("refund.exceeds_payment")) == 7
    assert Counter(verdicts("stripe")) == {"credited": 1, "debited": 3, "refund_exceeds_payment": 7}


def test_refunds_adding_up_to_the_payment_refund_it_fully_and_the_next_is_refused(api):
    pay(api, "standard", "pay-full", 8_000)
    for i in range(4):
        assert refund(api, "standard", f"rf-full-{i}", "pay-full", 2_000).json() == {"status": "debited"}
    over = refund(api, "standard", "rf-full-4", "pay-full", 1)
    assert over.status_code == 422 and over.json()["error"]["code"] == "refund_exceeds_payment"
    assert payment(api, "standard", "pay-full")["status"] == "refunded"
    assert balance("ada@example.com", "NGN") == 0


def test_refund_before_its_payment_is_409_then_debited_once_the_payment_is_credited(api):
    raw = encode(refund_payload("monnify", "mn-rf-early", "MNFY|01|early", 4_000))
    early = deliver(api, "monnify", raw)
    assert early.status_code == 409
    assert early.json()["status"] == early.json()["error"]["code"] == "payment_not_found"
    assert balance("ada@example.com", "NGN") is None  # nothing debited, no wallet made

    pay(api, "monnify", "MNFY|01|early", 10_000)
    again = deliver(api, "monnify", raw)  # the provider's retry
    assert (again.status_code, again.json()) == (200, {"status": "debited"})
    assert balance("ada@example.com", "NGN") == 6_000
    assert verdicts("monnify") == ["payment_not_found", "credited", "debited"]


def test_a_refund_may_take_a_wallet_below_zero_and_is_flagged(api):
    pay(api, "paystack", "ps-neg", 10_000)
    with db.connection_context():  # the application spent most of it (Floodgate only reports balances)
        Wallet.update(balance_minor=1_000).where(Wallet.customer == "ada@example.com").execute()
    assert refund(api, "paystack", "rf-neg", "ps-neg", 5_000).json() == {"status": "debited"}
    assert balance("ada@example.com", "NGN") == -4_000
    [flag] = audit("wallet.negative_balance")
    assert flag.entity_id == "ada@example.com:NGN" and '"balance_minor": -4000' in flag.detail


def test_a_refund_naming_another_currency_or_payer_debits_nothing_and_is_flagged(api):
    pay(api, "standard", "pay-x", 5_000, "NGN", "ada@example.com")
    other_payer = refund(api, "standard", "rf-x1", "pay-x", 1_000, "NGN", "mallory@example.com")
    other_currency = refund(api, "standard", "rf-x2", "pay-x", 1_000, "GHS", "ada@example.com")
    for resp in (other_payer, other_currency):
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "reference_conflict"
    assert balance("ada@example.com", "NGN") == 5_000
    assert len(audit("refund.reference_conflict")) == 2


def test_a_refund_reference_again_with_another_amount_is_a_conflict(api):
    pay(api, "stripe", "pi_again", 9_000, "USD", "jenny@example.com")
    assert refund(api, "stripe", "re_again", "pi_again", 1_000, "USD").json() == {"status": "debited"}
    with api.app.app_context():  # past the Redis marker: the ledger's unique key decides
        services.of(api.app).store.redis.delete("fg:{ref:stripe:re_again}:processed")
    changed = refund(api, "stripe", "re_again", "pi_again", 2_000, "USD")
    assert changed.status_code == 422 and changed.json()["error"]["code"] == "reference_conflict"
    assert balance("jenny@example.com", "USD") == 8_000


def test_a_refund_of_no_whole_number_of_minor_units_is_400(api):
    pay(api, "monnify", "MNFY|02|frac", 10_000)
    body = refund_payload("monnify", "mn-frac", "MNFY|02|frac", 100)
    body["eventData"]["refundAmount"] = 1.005  # naira: not a whole number of kobo
    resp = deliver(api, "monnify", encode(body))
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_payload"
    assert balance("ada@example.com", "NGN") == 10_000
    assert verdicts("monnify", "mn-frac") == ["invalid_payload"]


@pytest.mark.parametrize(
    "provider, change",
    [
        ("paystack", lambda b: b.update(event="refund.pending")),
        ("paystack", lambda b: b.update(event="refund.failed")),
        ("monnify", lambda b: b.update(eventType="FAILED_REFUND")),
        ("monnify", lambda b: b["eventData"].update(refundStatus="FAILED")),
        ("stripe", lambda b: b["data"]["object"].update(status="pending")),
        ("stripe", lambda b: b.update(type="refund.failed")),
        ("stripe", lambda b: b.update(type="charge.refunded")),
    ],
)
def test_a_refund_that_did_not_go_through_is_ignored(api, provider, change):
    pay(api, provider, "pay-ig", 10_000, "USD" if provider == "stripe" else "NGN")
    body = refund_payload(provider, "rf-ig", "pay-ig", 1_000, "USD" if provider == "stripe" else "NGN")
    change(body)
    resp = deliver(api, provider, encode(body))
    assert resp.status_code == 200 and resp.json()["status"] == "ignored", resp.text
    assert resp.json()["reason"] in ("not_successful", "not_debited", "event_type")
    with db.connection_context():  # a refund that failed first is kept (reversed), so a stale success moves nothing
        assert Refund.select().where(Refund.status == "debited").count() == 0
    assert balance("ada@example.com", "USD" if provider == "stripe" else "NGN") == 10_000


def test_documented_refund_samples_read_as_docs_payments_md_says():
    from testkit.payments import MONNIFY_REFUND, PAYSTACK_REFUND, STANDARD_REFUND, STRIPE_REFUND

    paystack = parse("paystack", encode(PAYSTACK_REFUND))
    assert isinstance(paystack, RefundNotification)
    assert (
        paystack.reference,
        paystack.payment_reference,
        paystack.amount_minor("NGN"),
        paystack.currency,
        paystack.customer,
    ) == ("132013318360", "T2154954_412829_3be32076_6lcg3", 5_000, "NGN", "damilola@email.com")
    monnify = parse("monnify", encode(MONNIFY_REFUND))
    assert (
        monnify.reference,
        monnify.payment_reference,
        monnify.amount_minor("NGN"),
        monnify.currency,
        monnify.customer,
    ) == ("refund-0001", "MNFY|76|20211117154810|000001", 10_000, None, None)
    for kind in ("refund.created", "refund.updated", "charge.refund.updated"):
        stripe = parse("stripe", encode({**STRIPE_REFUND, "type": kind}))
        assert (stripe.reference, stripe.payment_reference, stripe.amount_minor("USD"), stripe.currency) == (
            "re_3OXYZ",
            "pi_3OXYZ",
            1_000,
            "USD",
        )
    standard = parse("standard", encode(STANDARD_REFUND))
    assert (standard.reference, standard.payment_reference, standard.amount_minor("NGN"), standard.customer) == (
        "rf_1",
        "pay_1",
        2_000,
        "ada@example.com",
    )


def test_flutterwave_and_interswitch_have_no_refund_mapping():
    """Neither documents a refund webhook Floodgate could verify and tie to a payment (see
    docs/payments.md): their refund-like events are valid events that debit nothing."""
    assert set(REFUND_SPECS) == set(REFUND_PROVIDERS)
    body = payload("interswitch", "isw-1", 1_000)
    body["event"] = "TRANSACTION.UPDATED"
    note = parse("interswitch", encode(body))
    assert isinstance(note, PaymentNotification) and not note.succeeded
