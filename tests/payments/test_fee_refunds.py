"""Paystack fees passed on to the payer (docs/payments.md "Fees passed on"): a payment is credited
what was asked only where the difference is Paystack's own `fees`; a full refund of the whole
transaction (fee included) debits what was credited and is flagged `refund_includes_fee`; 422
only past the whole transaction. A `requested_amount` below `amount` that is not explained by
`fees` (Paystack's terminal sample) is credited what was paid, and flagged. Field values from
PaystackOSS/doc-code-snippets (named at each), the app in this process, real Redis and database."""

from __future__ import annotations

import pytest

from testkit.payments import (
    at_once,
    balance,
    deliver,
    encode,
    payload,
    refund_payload,
    until_answered,
    wallet_invariant_breaches,
)
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, Refund

EMAIL = "mizz@kaneah.com"


def charge(reference: str, amount, requested, fees) -> bytes:
    body = payload("paystack", reference, 1, "NGN", EMAIL)
    body["data"].update(amount=amount, requested_amount=requested, fees=fees)
    return encode(body)


def refund(reference: str, payment: str, amount: int) -> bytes:
    return encode(refund_payload("paystack", reference, payment, amount, "NGN", EMAIL))


def shown(api, reference: str) -> dict:
    return api.get(f"/v1/admin/payments/paystack/{reference}").json()


@pytest.mark.parametrize(
    "source, amount, requested, fees, credited, fees_minor, flag",
    [
        # src/doc/payments/bulk-charge/webhook/index.json: the payer paid Paystack's fee on top
        ("bulk-charge webhook", 25126, 25000, 126, 25000, 126, None),
        # src/api/transactions/verify/response.json
        ("transaction verify", 40333, 30050, 10283, 30050, 10283, None),
        # src/doc/terminal/deferred/events (charge.success of a POS terminal): amounts as strings,
        # fees null: 5000 was paid, whatever 200 was asked first
        ("terminal charge.success", "5000", "200", None, 5000, 0, "requested_amount_differs"),
        # the merchant bears the fee: amount == requested_amount
        ("refund sample's transaction", 5700, 5700, 52, 5700, 0, None),
    ],
)
def test_paystack_amounts_credit_what_was_asked_only_when_fees_explain_the_rest(
    api, source, amount, requested, fees, credited, fees_minor, flag
):
    raw = charge("T-fee", amount, requested, fees)
    assert sorted(a["status"] for a in at_once(api, "paystack", [raw] * 5)) == ["credited"] + ["duplicate"] * 4
    assert until_answered(api, "paystack", raw).json() == {"status": "duplicate"}
    record = shown(api, "T-fee")
    assert (record["amount_minor"], record["fees_minor"], record["flag"]) == (credited, fees_minor, flag), source
    assert balance(EMAIL, "NGN") == credited
    if flag:
        with db.connection_context():
            assert AuditLog.select().where(AuditLog.action == f"payment.{flag}").count() == 1


def test_a_full_refund_including_the_fee_debits_what_was_credited_once_and_is_flagged(api):
    assert deliver(api, "paystack", charge("T-bulk", 25126, 25000, 126)).json()["status"] == "credited"
    whole = refund("rf-whole", "T-bulk", 25126)
    answers = at_once(api, "paystack", [whole] * 5)
    assert sorted(a["status"] for a in answers) == ["debited"] + ["duplicate"] * 4, answers
    assert until_answered(api, "paystack", whole).json() == {"status": "duplicate"}
    assert balance(EMAIL, "NGN") == 0
    record = shown(api, "T-bulk")
    assert (record["refunded_minor"], record["status"]) == (25000, "refunded")
    with db.connection_context():
        row = Refund.get(Refund.reference == "rf-whole")
        assert (row.amount_minor, row.debited_minor, row.flag) == (25126, 25000, "refund_includes_fee")
    # past the whole transaction: refused
    resp = until_answered(api, "paystack", refund("rf-more", "T-bulk", 1))
    assert (resp.status_code, resp.json()["error"]["code"]) == (422, "refund_exceeds_payment")
    assert wallet_invariant_breaches() == []


def test_partial_refunds_reaching_into_the_fee_debit_up_to_what_was_credited(api):
    deliver(api, "paystack", charge("T-part", 25126, 25000, 126))
    assert until_answered(api, "paystack", refund("rf-a", "T-part", 20000)).json() == {"status": "debited"}
    assert until_answered(api, "paystack", refund("rf-b", "T-part", 5126)).json() == {"status": "debited"}
    assert balance(EMAIL, "NGN") == 0
    resp = until_answered(api, "paystack", refund("rf-c", "T-part", 1))
    assert resp.status_code == 422
    assert shown(api, "T-part")["refunded_minor"] == 25000


def test_a_refund_past_a_payment_without_fees_is_still_refused(api):
    deliver(api, "paystack", charge("T-nofee", 5700, 5700, 52))
    resp = until_answered(api, "paystack", refund("rf-x", "T-nofee", 5701))
    assert (resp.status_code, resp.json()["error"]["code"]) == (422, "refund_exceeds_payment")
    assert balance(EMAIL, "NGN") == 5700
