"""Disputes (docs/api.md "Disputes, refunds on every API version"): a dispute's money leaves the wallet
once when the provider withdraws it and comes back once when it reinstates it, however often and
however concurrently its events arrive; one opened but not lost moves nothing and says why. Real
Redis and database, the app in this process. Payloads are built field by field from the
providers' own material (named at each)."""

from __future__ import annotations

import copy

from testkit.payments import at_once, balance, deliver, encode, payload, until_answered, wallet_invariant_breaches

# Stripe's Dispute object (stripe-python 16.1.0 `stripe/_dispute.py`: id, object "dispute",
# amount, currency, charge, payment_intent, reason, status among warning_needs_response,
# warning_under_review, warning_closed, needs_response, under_review, won, lost) inside an Event
# (`stripe/_event.py`: charge.dispute.created / updated / closed / funds_withdrawn / funds_reinstated).
STRIPE_DISPUTE = {
    "id": "evt_1Dsp",
    "object": "event",
    "api_version": "2024-06-20",
    "created": 1700000200,
    "livemode": False,
    "pending_webhooks": 1,
    "type": "charge.dispute.funds_withdrawn",
    "request": {"id": None, "idempotency_key": None},
    "data": {
        "object": {
            "id": "dp_1Dsp",
            "object": "dispute",
            "amount": 2000,
            "currency": "usd",
            "charge": "ch_1Dsp",
            "payment_intent": "pi_1Dsp",
            "reason": "fraudulent",
            "status": "needs_response",
            "is_charge_refundable": False,
            "livemode": False,
            "metadata": {},
        }
    },
}

# Paystack's charge.dispute.resolve sample (PaystackOSS/doc-code-snippets,
# src/doc/payments/webhooks/events/charge-dispute-resolve.json): the fields Floodgate reads, with
# the sample's values: dispute id 358949, refund_amount 5700 (kobo), resolution auto-accepted,
# the transaction 5qm4pv2mxs9rltp of 5700 now `reversed`, customer john@example.com.
PAYSTACK_RESOLVE = {
    "event": "charge.dispute.resolve",
    "data": {
        "id": 358949,
        "refund_amount": 5700,
        "currency": "NGN",
        "status": "resolved",
        "resolution": "auto-accepted",
        "domain": "live",
        "transaction": {
            "id": 896467592,
            "status": "reversed",
            "reference": "5qm4pv2mxs9rltp",
            "amount": 5700,
            "currency": "NGN",
            "requested_amount": 5700,
        },
        "transaction_reference": None,
        "category": "chargeback",
        "customer": {"id": 5406463, "email": "john@example.com", "customer_code": "CUS_6wbxh6689vt0n7s"},
    },
}


def stripe_dispute(event_type: str, status: str = "needs_response", dispute: str = "dp_1Dsp", pi: str = "pi_1Dsp"):
    body = copy.deepcopy(STRIPE_DISPUTE)
    body["type"] = event_type
    body["data"]["object"].update(id=dispute, status=status, payment_intent=pi)
    return encode(body)


def record(api, provider: str, reference: str) -> dict:
    resp = api.get(f"/v1/admin/payments/{provider}/{reference}")
    assert resp.status_code == 200, resp.text
    return resp.json()


def pay_stripe(api, reference: str = "pi_1Dsp", amount: int = 2000, email: str = "jenny@example.com"):
    resp = deliver(api, "stripe", encode(payload("stripe", reference, amount, "USD", email)))
    assert resp.json()["status"] == "credited", resp.text


def statuses(answers: list[dict]) -> list[str]:
    return sorted(a["status"] for a in answers)


def test_stripe_funds_withdrawn_debits_once_and_reinstated_credits_back_once(api):
    pay_stripe(api)
    withdrawn = stripe_dispute("charge.dispute.funds_withdrawn")
    assert statuses(at_once(api, "stripe", [withdrawn] * 5)) == ["debited"] + ["duplicate"] * 4
    assert until_answered(api, "stripe", withdrawn).json() == {"status": "duplicate"}
    assert balance("jenny@example.com", "USD") == 0
    shown = record(api, "stripe", "pi_1Dsp")
    assert (shown["status"], shown["disputed_minor"]) == ("disputed", 2000)

    reinstated = stripe_dispute("charge.dispute.funds_reinstated", "won")
    assert statuses(at_once(api, "stripe", [reinstated] * 5)) == ["credited"] + ["duplicate"] * 4
    assert until_answered(api, "stripe", reinstated).json() == {"status": "duplicate"}
    # closed (won) after the reinstatement, and a late repeat of the withdrawal, move nothing
    assert until_answered(api, "stripe", stripe_dispute("charge.dispute.closed", "won")).json()["status"] == "duplicate"
    assert until_answered(api, "stripe", withdrawn).json() == {"status": "duplicate"}
    assert balance("jenny@example.com", "USD") == 2000
    shown = record(api, "stripe", "pi_1Dsp")
    assert (shown["status"], shown["disputed_minor"]) == ("credited", 0)
    assert wallet_invariant_breaches() == []


def test_a_dispute_closed_lost_debits_once_with_or_without_funds_withdrawn(api):
    pay_stripe(api, "pi_a")
    pay_stripe(api, "pi_b")
    # a: funds_withdrawn first, then closed lost; b: closed lost only, its funds_withdrawn late
    a_withdrawn = stripe_dispute("charge.dispute.funds_withdrawn", dispute="dp_a", pi="pi_a")
    a_lost = stripe_dispute("charge.dispute.closed", "lost", dispute="dp_a", pi="pi_a")
    b_lost = stripe_dispute("charge.dispute.closed", "lost", dispute="dp_b", pi="pi_b")
    b_withdrawn = stripe_dispute("charge.dispute.funds_withdrawn", dispute="dp_b", pi="pi_b")
    assert until_answered(api, "stripe", a_withdrawn).json() == {"status": "debited"}
    assert statuses(at_once(api, "stripe", [a_lost] * 5)) == ["duplicate"] * 5
    assert statuses(at_once(api, "stripe", [b_lost] * 3 + [b_withdrawn] * 2)) == ["debited"] + ["duplicate"] * 4
    assert balance("jenny@example.com", "USD") == 0
    assert record(api, "stripe", "pi_b")["disputed_minor"] == 2000
    assert wallet_invariant_breaches() == []


def test_a_dispute_opened_moves_nothing_and_says_why(api):
    pay_stripe(api, "pi_open")
    for event_type in ("charge.dispute.created", "charge.dispute.updated"):
        resp = until_answered(api, "stripe", stripe_dispute(event_type, dispute="dp_open", pi="pi_open"))
        assert (resp.status_code, resp.json()) == (200, {"status": "ignored", "reason": "dispute_open"})
    inquiry = stripe_dispute("charge.dispute.closed", "warning_closed", dispute="dp_open", pi="pi_open")
    assert until_answered(api, "stripe", inquiry).json() == {"status": "ignored", "reason": "not_withdrawn"}
    assert balance("jenny@example.com", "USD") == 2000
    assert record(api, "stripe", "pi_open")["status"] == "credited"


def test_a_dispute_reinstated_before_its_withdrawal_arrives_moves_nothing_either_time(api):
    pay_stripe(api, "pi_r")
    given = stripe_dispute("charge.dispute.funds_reinstated", "won", dispute="dp_r", pi="pi_r")
    taken = stripe_dispute("charge.dispute.funds_withdrawn", dispute="dp_r", pi="pi_r")
    assert until_answered(api, "stripe", given).json() == {"status": "ignored", "reason": "not_withdrawn"}
    assert until_answered(api, "stripe", taken).json() == {"status": "duplicate"}
    assert balance("jenny@example.com", "USD") == 2000
    assert wallet_invariant_breaches() == []


def test_a_dispute_of_a_payment_not_in_the_ledger_yet_is_409_until_it_is(api):
    withdrawn = stripe_dispute("charge.dispute.funds_withdrawn", dispute="dp_early", pi="pi_early")
    resp = until_answered(api, "stripe", withdrawn)
    assert (resp.status_code, resp.json()["status"]) == (409, "payment_not_found")
    pay_stripe(api, "pi_early")
    assert until_answered(api, "stripe", withdrawn).json() == {"status": "debited"}
    assert balance("jenny@example.com", "USD") == 0


def test_stripe_dispute_amounts_use_stripes_own_decimals(api):
    # Stripe counts MGA as zero-decimal (docs.stripe.com/currencies): 500 is 50000 ISO minor units
    deliver(api, "stripe", encode(payload("stripe", "pi_mga", 500, "MGA", "jenny@example.com")))
    body = copy.deepcopy(STRIPE_DISPUTE)
    body["data"]["object"].update(id="dp_mga", payment_intent="pi_mga", amount=500, currency="mga")
    assert until_answered(api, "stripe", encode(body)).json() == {"status": "debited"}
    assert balance("jenny@example.com", "MGA") == 0
    assert record(api, "stripe", "pi_mga")["disputed_minor"] == 50000


def test_paystack_resolved_dispute_that_returned_money_debits_refund_amount_once(api):
    paid = payload("paystack", "5qm4pv2mxs9rltp", 5700, "NGN", "john@example.com")
    assert deliver(api, "paystack", encode(paid)).json()["status"] == "credited"
    raw = encode(PAYSTACK_RESOLVE)
    assert statuses(at_once(api, "paystack", [raw] * 5)) == ["debited"] + ["duplicate"] * 4
    assert until_answered(api, "paystack", raw).json() == {"status": "duplicate"}
    assert balance("john@example.com", "NGN") == 0
    shown = record(api, "paystack", "5qm4pv2mxs9rltp")
    assert (shown["status"], shown["disputed_minor"]) == ("disputed", 5700)
    assert wallet_invariant_breaches() == []


def test_paystack_dispute_opened_or_declined_moves_nothing(api):
    paid = payload("paystack", "5qm4pv2mxs9rltp", 5700, "NGN", "john@example.com")
    deliver(api, "paystack", encode(paid))
    created = copy.deepcopy(PAYSTACK_RESOLVE)
    created["event"] = "charge.dispute.create"  # charge-dispute-create.json: same data, no resolution
    created["data"].update(id=358950, status="awaiting-merchant-feedback", resolution=None)
    assert until_answered(api, "paystack", encode(created)).json() == {"status": "ignored", "reason": "dispute_open"}
    declined = copy.deepcopy(PAYSTACK_RESOLVE)
    declined["data"].update(id=358951, resolution="declined")  # Paystack's resolve call: merchant-accepted | declined
    assert until_answered(api, "paystack", encode(declined)).json() == {"status": "ignored", "reason": "not_withdrawn"}
    assert balance("john@example.com", "NGN") == 5700
