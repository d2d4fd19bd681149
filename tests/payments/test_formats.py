"""Payload shapes providers send today (docs/payments.md "Formats in use today"), each accepted as
its first-party source shows it, and credited exactly once; the app in this process, real Redis
and database."""

from __future__ import annotations

import copy
import json

from testkit.payments import at_once, balance, deliver, encode, payload, until_answered, wallet_invariant_breaches
from tests.payments.test_stripe_refunds import refund_event

# A Charge of Stripe's Charges API inside a charge.succeeded Event (stripe-python 16.1.0
# `stripe/_charge.py`: payment_intent is null for a charge made without a PaymentIntent;
# amount_captured, captured, paid, status "succeeded", receipt_email, metadata).
STRIPE_CHARGE_SUCCEEDED = {
    "id": "evt_1Chg",
    "object": "event",
    "api_version": "2024-06-20",
    "created": 1700000400,
    "livemode": False,
    "pending_webhooks": 1,
    "type": "charge.succeeded",
    "request": {"id": "req_3", "idempotency_key": None},
    "data": {
        "object": {
            "id": "ch_1Chg",
            "object": "charge",
            "amount": 2000,
            "amount_captured": 2000,
            "amount_refunded": 0,
            "captured": True,
            "currency": "usd",
            "paid": True,
            "payment_intent": None,
            "receipt_email": "jenny@example.com",
            "metadata": {},
            "refunded": False,
            "status": "succeeded",
        }
    },
}


def test_a_stripe_charges_api_charge_is_credited_once_by_its_charge_id(api):
    raw = encode(STRIPE_CHARGE_SUCCEEDED)
    assert sorted(a["status"] for a in at_once(api, "stripe", [raw] * 5)) == ["credited"] + ["duplicate"] * 4
    assert until_answered(api, "stripe", raw).json() == {"status": "duplicate"}
    assert balance("jenny@example.com", "USD") == 2000
    # its refund names the charge, not a PaymentIntent
    refund = json.loads(refund_event("ch_1Chg", "re_chg", 500))
    refund["data"]["object"].update(payment_intent=None, charge="ch_1Chg")
    raw_refund = encode(refund)
    assert until_answered(api, "stripe", raw_refund).json() == {"status": "debited"}
    assert balance("jenny@example.com", "USD") == 1500
    assert wallet_invariant_breaches() == []


def test_a_stripe_charge_of_a_payment_intent_is_left_to_the_payment_intents_event(api):
    body = copy.deepcopy(STRIPE_CHARGE_SUCCEEDED)
    body["data"]["object"]["payment_intent"] = "pi_3OXYZ"
    resp = deliver(api, "stripe", encode(body))
    assert resp.json() == {"status": "ignored", "reason": "event_type"}
    assert deliver(api, "stripe", encode(payload("stripe", "pi_3OXYZ", 2000, "USD", "jenny@example.com"))).json() == {
        "status": "credited"
    }
    assert balance("jenny@example.com", "USD") == 2000


def test_paystack_metadata_string_with_whitespace_before_the_object_names_the_wallet(api, reconfigure):
    # PaystackOSS/openapi: metadata is a "stringified JSON object"; JSON allows whitespace before it
    reconfigure(payment_account_field="account_id")
    body = payload("paystack", "ps-meta-space", 5000, "NGN", "ada@example.com")
    body["data"]["metadata"] = ' \n{"account_id": "acct-42"}'
    assert deliver(api, "paystack", encode(body)).json() == {"status": "credited"}
    assert balance("acct-42", "NGN") == 5000
    assert balance("ada@example.com", "NGN") is None
