"""Payload shapes providers send today (docs/payments.md "Formats in use today"), each accepted as
its first-party source shows it, and credited exactly once; the app in this process, real Redis
and database."""

from __future__ import annotations

import copy
import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from testkit.payments import (
    at_once,
    at_once_signed,
    balance,
    deliver,
    encode,
    payload,
    standard_v1a_headers,
    until_answered,
    wallet_invariant_breaches,
    whpk,
)
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


def test_a_standard_webhooks_v1a_payment_is_credited_once_repeated_and_at_once(api, reconfigure, app):
    from webhooks import services

    key = Ed25519PrivateKey.generate()
    reconfigure(secrets={**services.of(app).config.secrets, "standard": (whpk(key),)})
    raw = encode(payload("standard", "std-v1a-1", 4200, "NGN", "ada@example.com"))
    answers = at_once_signed(api, "standard", [(raw, standard_v1a_headers(raw, key)) for _ in range(8)])
    assert sorted(a["status"] for a in answers) == ["credited"] + ["duplicate"] * 7, answers
    for _ in range(3):
        assert deliver(api, "standard", raw, headers=standard_v1a_headers(raw, key)).json() == {"status": "duplicate"}
    assert balance("ada@example.com", "NGN") == 4200
    # the same body under a v1 (HMAC) signature, no whsec_ secret configured: refused
    assert deliver(api, "standard", raw).status_code == 401
    other = Ed25519PrivateKey.generate()
    assert deliver(api, "standard", raw, headers=standard_v1a_headers(raw, other)).status_code == 401
    assert wallet_invariant_breaches() == []
