"""Flutterwave's other formats (docs/payments.md "Formats in use today"): its v4 envelope signed
with `flutterwave-signature`, and the flat payload its own WooCommerce plugin reads (`txRef`,
`status`, no `data`). Each is credited once however often and however concurrently it comes; a
local HTTP server plays Flutterwave's API (tests/payments/providers/test_flutterwave.py)."""

from __future__ import annotations

import pytest

from testkit.payments import (
    SECRET,
    at_once_signed,
    balance,
    deliver,
    encode,
    flutterwave_v4_headers,
    payload,
    verdicts,
    wallet_invariant_breaches,
)
from tests.payments.providers.test_flutterwave import SECRET_KEY, FakeFlutterwave
from webhooks.storage.records.db import db

CHARGE_ID = "chg_Hq4oBRTJ4r"


def v4_charge(reference: str, amount, status: str = "succeeded", email: str = "ada@example.com") -> dict:
    """Flutterwave's v4 sample "Successful Payment" (developer.flutterwave.com/docs/webhooks),
    trimmed of the payment method; amount in major units."""
    return {
        "data": {
            "amount": amount,
            "created_datetime": 1735116842.116,
            "currency": "NGN",
            "customer": {"email": email, "id": "cus_csm0pcQim4", "meta": {}, "name": None, "phone": None},
            "description": None,
            "id": CHARGE_ID,
            "meta": {},
            "processor_response": {"code": "00", "type": "approved"},
            "redirect_url": "https://example.com",
            "reference": reference,
            "status": status,
        },
        "id": "wbk_W5p6ktwU0jQ8RO4By860",
        "timestamp": 1735116884019,
        "type": "charge.completed",
    }


def flat(tx_ref, status: str = "successful", amount=1) -> dict:
    """The flat payload: Flutterwave's WooCommerce plugin (Flutterwave/WooCommerce, includes/
    class.flw_wc_payment_gateway.php before 2.3.1) reads a body with a top-level `status` as this
    shape, takes `txRef` and asks Flutterwave's API for the rest. Its amount is not believed."""
    return {
        "txRef": tx_ref,
        "flwRef": "FLW-MOCK-1",
        "status": status,
        "amount": amount,
        "currency": "NGN",
        "customer": {"email": "mallory@example.com"},
        "event.type": "CARD_TRANSACTION",
    }


@pytest.fixture
def flutterwave(reconfigure):
    fake = FakeFlutterwave()
    reconfigure(flutterwave_verify=True, flutterwave_api_base=fake.url, flutterwave_secret_key=SECRET_KEY)
    yield fake
    fake.close()


def test_a_v4_charge_is_verified_then_credited_once_repeated_and_at_once(api, flutterwave):
    flutterwave.knows("order-v4-1", 2500, tx_id=CHARGE_ID)
    raw = encode(v4_charge("order-v4-1", 2500))
    answers = at_once_signed(api, "flutterwave", [(raw, flutterwave_v4_headers(raw))] * 8)
    assert sorted(a["status"] for a in answers) == ["credited"] + ["duplicate"] * 7, answers
    for _ in range(3):
        assert deliver(api, "flutterwave", raw, headers=flutterwave_v4_headers(raw)).json() == {"status": "duplicate"}
    assert balance("ada@example.com", "NGN") == 250000
    assert {r["path"] for r in flutterwave.requests} == {f"/v3/transactions/{CHARGE_ID}/verify"}
    # its v3 webhook for the same payment (tx_ref = the v4 reference) is the same payment
    v3 = payload("flutterwave", "order-v4-1", 250000, "NGN", "ada@example.com")
    v3["data"]["id"] = CHARGE_ID
    assert deliver(api, "flutterwave", encode(v3)).json() == {"status": "duplicate"}
    assert balance("ada@example.com", "NGN") == 250000
    assert wallet_invariant_breaches() == []


def test_a_v4_charge_flutterwave_does_not_confirm_is_not_credited(api, flutterwave):
    flutterwave.knows("order-v4-2", 25, tx_id=CHARGE_ID)  # Flutterwave says 25, the webhook 2500
    raw = encode(v4_charge("order-v4-2", 2500))
    resp = deliver(api, "flutterwave", raw, headers=flutterwave_v4_headers(raw))
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "verification_failed"
    assert balance("ada@example.com", "NGN") is None


@pytest.mark.parametrize("status", ["failed", "pending", "successful"])
def test_a_v4_charge_that_did_not_succeed_is_ignored_unasked(api, flutterwave, status):
    raw = encode(v4_charge("order-v4-3", 2500, status=status))
    resp = deliver(api, "flutterwave", raw, headers=flutterwave_v4_headers(raw))
    assert resp.json() == {"status": "ignored", "reason": "not_successful"}
    assert flutterwave.requests == [] and balance("ada@example.com", "NGN") is None


def test_a_v4_charge_signed_otherwise_is_refused(api, flutterwave):
    raw = encode(v4_charge("order-v4-4", 2500))
    forged = flutterwave_v4_headers(raw, secret="not-the-secret-hash-at-all")
    assert deliver(api, "flutterwave", raw, headers=forged).status_code == 401
    assert deliver(api, "flutterwave", raw, headers={}).status_code == 401
    assert flutterwave.requests == [] and balance("ada@example.com", "NGN") is None


def test_the_flat_payload_is_looked_up_and_credited_once_repeated_and_at_once(api, flutterwave):
    flutterwave.knows_reference("WOOC_1_flat", 2500)
    raw = encode(flat("WOOC_1_flat"))
    headers = {"verif-hash": SECRET["flutterwave"]}
    answers = at_once_signed(api, "flutterwave", [(raw, headers)] * 8)
    assert sorted(a["status"] for a in answers) == ["credited"] + ["duplicate"] * 7, answers
    for _ in range(3):
        assert deliver(api, "flutterwave", raw).json() == {"status": "duplicate"}
    # Flutterwave's amount and payer, not the body's
    assert balance("ada@example.com", "NGN") == 250000
    assert balance("mallory@example.com", "NGN") is None
    assert all(r["path"] == "/v3/transactions/verify_by_reference?tx_ref=WOOC_1_flat" for r in flutterwave.requests)
    assert all(r["authorization"] == f"Bearer {SECRET_KEY}" for r in flutterwave.requests)
    # the v3 webhook of the same payment afterwards: a duplicate
    assert deliver(api, "flutterwave", encode(payload("flutterwave", "WOOC_1_flat", 250000))).json() == {
        "status": "duplicate"
    }
    assert wallet_invariant_breaches() == []


@pytest.mark.parametrize(
    "body, reason",
    [
        (flat("WOOC_2_flat", status="failed"), "not_successful"),
        (flat("WOOC_unknown"), "not_successful"),  # Flutterwave knows no such transaction
        (flat("x" * 129), "unverifiable"),  # no usable reference
        (flat("WOOC_3\r\nX-Injected: 1"), "unverifiable"),
        (flat(12.5), "unverifiable"),
        (flat(None), "unverifiable"),
    ],
)
def test_a_flat_payload_that_cannot_be_credited_is_ignored_never_400(api, flutterwave, body, reason):
    resp = deliver(api, "flutterwave", encode(body))
    assert (resp.status_code, resp.json()) == (200, {"status": "ignored", "reason": reason}), resp.text
    assert balance("ada@example.com", "NGN") is None
    if reason == "unverifiable" or body["status"] != "successful":
        assert flutterwave.requests == []


def test_a_flat_payload_whose_transaction_failed_at_flutterwave_is_ignored(api, flutterwave):
    flutterwave.knows_reference("WOOC_4_flat", 2500, status="failed")
    resp = deliver(api, "flutterwave", encode(flat("WOOC_4_flat")))
    assert resp.json() == {"status": "ignored", "reason": "not_successful"}
    assert balance("ada@example.com", "NGN") is None


def test_a_flat_payload_reference_reaches_flutterwave_as_one_query_value(api, flutterwave):
    ref = "WOOC_5&tx_ref=other#x y"
    flutterwave.knows_reference(ref, 10)
    assert deliver(api, "flutterwave", encode(flat(ref))).json() == {"status": "credited"}
    assert balance("ada@example.com", "NGN") == 1000


def test_a_flat_payload_without_flutterwave_s_api_is_ignored_unverifiable(api):
    resp = deliver(api, "flutterwave", encode(flat("WOOC_6_flat")))
    assert resp.json() == {"status": "ignored", "reason": "unverifiable"}
    assert verdicts("flutterwave", "WOOC_6_flat") == ["ignored"]


def test_a_flat_payload_while_flutterwave_is_down_is_503_and_credited_on_the_retry(api, flutterwave):
    flutterwave.knows_reference("WOOC_7_flat", 2500, http_status=500)
    raw = encode(flat("WOOC_7_flat"))
    assert deliver(api, "flutterwave", raw).status_code == 503
    assert balance("ada@example.com", "NGN") is None
    flutterwave.knows_reference("WOOC_7_flat", 2500)
    assert deliver(api, "flutterwave", raw).json() == {"status": "credited"}
    assert balance("ada@example.com", "NGN") == 250000


def test_a_flat_payload_answered_with_another_transaction_is_ignored(api, flutterwave):
    flutterwave.knows_reference("WOOC_8_flat", 2500)
    flutterwave.references["WOOC_8_flat"][1]["data"]["tx_ref"] = "WOOC_other"
    resp = deliver(api, "flutterwave", encode(flat("WOOC_8_flat")))
    assert resp.json() == {"status": "ignored", "reason": "not_successful"}
    assert balance("ada@example.com", "NGN") is None


def test_a_flutterwave_signature_holding_the_secret_hash_is_not_stored(api, flutterwave):
    flutterwave.knows("order-v4-5", 10, tx_id=CHARGE_ID)
    raw = encode(v4_charge("order-v4-5", 10))
    assert deliver(api, "flutterwave", raw, headers={"flutterwave-signature": SECRET["flutterwave"]}).json() == {
        "status": "credited"
    }
    with db.connection_context():
        stored = db.execute_sql("SELECT headers FROM webhook_calls").fetchone()[0]
    assert SECRET["flutterwave"] not in stored and "<redacted>" in stored
