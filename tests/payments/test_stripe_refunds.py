"""Stripe refunds on every API version (docs/api.md "Disputes, refunds on every API version"): before
2024-10-28 a card refund is announced by `charge.refunded` (the charge's cumulative
`amount_refunded`), after it by `refund.*` events; both may come for the same refunds, in any
order, repeated, at once. Each refund debits once; one that fails or is canceled after it was
debited is credited back once; amounts are in Stripe's own decimals. Real Redis and database,
the app in this process."""

from __future__ import annotations

import copy
import itertools
import random

import pytest

from testkit.payments import (
    STRIPE_REFUND,
    at_once,
    balance,
    deliver,
    encode,
    payload,
    until_answered,
    wallet_invariant_breaches,
)

# A Charge inside a charge.refunded Event (stripe-python 16.1.0 `stripe/_charge.py`: id, object
# "charge", amount, amount_captured, amount_refunded (cumulative), currency, payment_intent,
# refunded, status; `stripe/_event.py`: charge.refunded), on an API version before 2024-10-28.
STRIPE_CHARGE_REFUNDED = {
    "id": "evt_1Chr",
    "object": "event",
    "api_version": "2024-06-20",
    "created": 1700000300,
    "livemode": False,
    "pending_webhooks": 1,
    "type": "charge.refunded",
    "request": {"id": "req_2", "idempotency_key": None},
    "data": {
        "object": {
            "id": "ch_1Chr",
            "object": "charge",
            "amount": 10000,
            "amount_captured": 10000,
            "amount_refunded": 3000,
            "captured": True,
            "currency": "usd",
            "paid": True,
            "payment_intent": "pi_1Chr",
            "refunded": False,
            "status": "succeeded",
            "receipt_email": "jenny@example.com",
        }
    },
}
EMAIL = "jenny@example.com"


def charge_refunded(pi: str, cumulative: int, currency: str = "usd", charge: str | None = None) -> bytes:
    body = copy.deepcopy(STRIPE_CHARGE_REFUNDED)
    body["data"]["object"].update(
        id=charge or f"ch_{pi}", payment_intent=pi, amount_refunded=cumulative, currency=currency
    )
    return encode(body)


def refund_event(
    pi: str, refund: str, amount: int, type_: str = "refund.updated", status: str = "succeeded", currency: str = "usd"
) -> bytes:
    body = copy.deepcopy(STRIPE_REFUND)  # a Refund object (stripe-python `stripe/_refund.py`)
    body["type"] = type_
    body["data"]["object"].update(id=refund, payment_intent=pi, amount=amount, status=status, currency=currency)
    return encode(body)


def pay(api, pi: str, amount: int = 10000, currency: str = "USD") -> None:
    resp = deliver(api, "stripe", encode(payload("stripe", pi, amount, currency, EMAIL)))
    assert resp.json()["status"] == "credited", resp.text


def shown(api, pi: str) -> dict:
    return api.get(f"/v1/admin/payments/stripe/{pi}").json()


def test_every_order_of_charge_refunded_and_refund_events_debits_each_refund_once(api):
    # two refunds of one charge: re_1 of 3000, then re_2 of 2000; charge.refunded says 3000, then 5000
    for n, order in enumerate(itertools.permutations(range(4))):
        pi = f"pi_order{n}"
        pay(api, pi)
        events = [
            refund_event(pi, f"re_{n}_1", 3000),
            charge_refunded(pi, 3000),
            refund_event(pi, f"re_{n}_2", 2000, "refund.created"),
            charge_refunded(pi, 5000),
        ]
        for i in order:
            resp = until_answered(api, "stripe", events[i])
            assert resp.status_code == 200 and resp.json()["status"] in ("debited", "duplicate"), resp.text
        for raw in events:  # every one again: nothing moves
            assert until_answered(api, "stripe", raw).json() == {"status": "duplicate"}
        record = shown(api, pi)
        assert (record["refunded_minor"], record["status"]) == (5000, "partially_refunded"), (order, record)
    assert balance(EMAIL, "USD") == 24 * 5000
    assert wallet_invariant_breaches() == []


@pytest.mark.parametrize("seed", range(3))
def test_charge_refunded_and_refund_events_at_once_debit_each_refund_once(api, seed):
    pi = f"pi_burst{seed}"
    pay(api, pi)
    events = [
        refund_event(pi, f"re_b{seed}_1", 3000),
        refund_event(pi, f"re_b{seed}_1", 3000, "refund.created"),
        charge_refunded(pi, 3000),
        refund_event(pi, f"re_b{seed}_2", 2000, "refund.created"),
        charge_refunded(pi, 5000),
    ] * 5
    random.Random(seed).shuffle(events)
    answers = at_once(api, "stripe", events)
    assert {a["status"] for a in answers} <= {"debited", "duplicate"}, answers
    assert shown(api, pi)["refunded_minor"] == 5000
    assert balance(EMAIL, "USD") == 5000
    assert wallet_invariant_breaches() == []


def test_a_refund_that_fails_after_it_was_debited_is_credited_back_once(api):
    pay(api, "pi_fail")
    assert until_answered(api, "stripe", refund_event("pi_fail", "re_f", 4000)).json() == {"status": "debited"}
    failed = refund_event("pi_fail", "re_f", 4000, "refund.failed", "failed")
    canceled = refund_event("pi_fail", "re_f", 4000, "refund.updated", "canceled")
    answers = at_once(api, "stripe", [failed] * 3 + [canceled] * 2)
    assert sorted(a["status"] for a in answers) == ["credited"] + ["duplicate"] * 4
    # a late repeat of the success, and the charge's older cumulative amount, move nothing
    assert until_answered(api, "stripe", refund_event("pi_fail", "re_f", 4000)).json() == {"status": "duplicate"}
    assert until_answered(api, "stripe", charge_refunded("pi_fail", 4000)).json() == {"status": "duplicate"}
    assert balance(EMAIL, "USD") == 10000
    assert (shown(api, "pi_fail")["refunded_minor"], shown(api, "pi_fail")["status"]) == (0, "credited")
    assert wallet_invariant_breaches() == []


def test_a_refund_counted_by_charge_refunded_that_then_fails_is_credited_back(api):
    pay(api, "pi_cf")
    assert until_answered(api, "stripe", charge_refunded("pi_cf", 2500)).json() == {"status": "debited"}
    failed = refund_event("pi_cf", "re_cf", 2500, "refund.failed", "failed")
    assert until_answered(api, "stripe", failed).json() == {"status": "credited"}
    assert until_answered(api, "stripe", charge_refunded("pi_cf", 2500)).json() == {"status": "duplicate"}
    assert balance(EMAIL, "USD") == 10000


def test_a_refund_that_fails_before_anything_was_debited_says_so(api):
    pay(api, "pi_nf")
    failed = refund_event("pi_nf", "re_nf", 1000, "refund.failed", "failed")
    assert until_answered(api, "stripe", failed).json() == {"status": "ignored", "reason": "not_debited"}
    assert until_answered(api, "stripe", refund_event("pi_nf", "re_nf", 1000)).json() == {"status": "duplicate"}
    assert balance(EMAIL, "USD") == 10000


@pytest.mark.parametrize(
    "currency, stripe_amount, iso_minor",
    [("MGA", 500, 50000), ("ISK", 10000, 100), ("JPY", 1200, 1200), ("USD", 1999, 1999)],
)
def test_refunds_and_charge_refunded_use_stripes_own_decimals(api, currency, stripe_amount, iso_minor):
    # docs.stripe.com/currencies: MGA zero-decimal for Stripe (two in ISO 4217); ISK two-decimal
    # for Stripe (zero in ISO 4217)
    pay(api, "pi_dec", stripe_amount, currency)
    assert balance(EMAIL, currency) == iso_minor
    full = refund_event("pi_dec", "re_dec", stripe_amount, currency=currency.lower())
    assert until_answered(api, "stripe", full).json() == {"status": "debited"}
    assert balance(EMAIL, currency) == 0
    refunded = charge_refunded("pi_dec", stripe_amount, currency.lower())
    assert until_answered(api, "stripe", refunded).json() == {"status": "duplicate"}
    assert (shown(api, "pi_dec")["refunded_minor"], shown(api, "pi_dec")["status"]) == (iso_minor, "refunded")


def test_charge_refunded_past_the_payment_is_refused_and_flagged(api):
    pay(api, "pi_over", 1000)
    resp = until_answered(api, "stripe", charge_refunded("pi_over", 1001))
    assert (resp.status_code, resp.json()["error"]["code"]) == (422, "refund_exceeds_payment")
    assert balance(EMAIL, "USD") == 1000
