"""A Paystack dispute resolved with a refund and the `refund.processed` of that refund are the same
money (Paystack's refund objects carry a `dispute` field; its refund webhook names none): they
debit the wallet once between them, in either order, repeated and at once. Real Redis and
database, the app in this process; payloads are Paystack's own samples (named in the helpers)."""

from __future__ import annotations

import copy
import random

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
from tests.payments.test_disputes import PAYSTACK_RESOLVE, record
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog

PAYER = "john@example.com"


def pay(api, reference: str, amount: int) -> None:
    resp = deliver(api, "paystack", encode(payload("paystack", reference, amount, "NGN", PAYER)))
    assert resp.json()["status"] == "credited", resp.text


def resolved(reference: str, dispute_id: int, refund_amount: int) -> bytes:
    """Paystack's charge.dispute.resolve sample, for `reference`, returning `refund_amount`."""
    body = copy.deepcopy(PAYSTACK_RESOLVE)
    body["data"].update(id=dispute_id, refund_amount=refund_amount)
    body["data"]["transaction"]["reference"] = reference
    return encode(body)


def refunded(reference: str, refund_reference: str, amount: int) -> bytes:
    """Paystack's refund.processed sample (doc-code-snippets doc/payments/refunds/events.js)."""
    return encode(refund_payload("paystack", refund_reference, reference, amount, "NGN", PAYER))


def statuses(answers: list[dict]) -> list[str]:
    return sorted(a["status"] for a in answers)


def test_dispute_then_its_refund_debits_once(api):
    pay(api, "ps-dr-1", 5700)
    assert until_answered(api, "paystack", resolved("ps-dr-1", 901, 5700)).json() == {"status": "debited"}
    assert until_answered(api, "paystack", refunded("ps-dr-1", "rf-901", 5700)).json() == {"status": "duplicate"}
    assert until_answered(api, "paystack", refunded("ps-dr-1", "rf-901", 5700)).json() == {"status": "duplicate"}
    assert balance(PAYER, "NGN") == 0
    assert record(api, "paystack", "ps-dr-1")["disputed_minor"] == 5700
    assert wallet_invariant_breaches() == []


def test_refund_then_its_dispute_debits_once_and_is_flagged(api):
    pay(api, "ps-dr-2", 5700)
    assert until_answered(api, "paystack", refunded("ps-dr-2", "rf-902", 5700)).json() == {"status": "debited"}
    assert until_answered(api, "paystack", resolved("ps-dr-2", 902, 5700)).json() == {"status": "duplicate"}
    assert until_answered(api, "paystack", resolved("ps-dr-2", 902, 5700)).json() == {"status": "duplicate"}
    assert balance(PAYER, "NGN") == 0
    shown = record(api, "paystack", "ps-dr-2")
    assert (shown["refunded_minor"], shown["disputed_minor"]) == (5700, 0)
    with db.connection_context():
        flagged = [a.entity_id for a in AuditLog.select().where(AuditLog.action == "refund.dispute_refund")]
    assert flagged == ["paystack:rf-902"]
    assert wallet_invariant_breaches() == []


def test_a_dispute_and_its_refund_sent_repeatedly_and_at_once_debit_once(api):
    rng = random.Random(60)
    for round_ in range(6):
        reference = f"ps-dr-burst-{round_}"
        pay(api, reference, 5700)
        raws = [resolved(reference, 950 + round_, 5700)] * 6 + [refunded(reference, f"rf-b{round_}", 5700)] * 6
        rng.shuffle(raws)
        answers = at_once(api, "paystack", raws)
        assert statuses(answers) == ["debited"] + ["duplicate"] * 11, (round_, answers)
        assert balance(PAYER, "NGN") == 0, round_
        assert wallet_invariant_breaches() == []
        # the next round pays into the same wallet again
        assert until_answered(api, "paystack", refunded(reference, f"rf-b{round_}", 5700)).json() == {
            "status": "duplicate"
        }


def test_other_refunds_of_a_disputed_payment_still_debit(api):
    pay(api, "ps-dr-3", 10000)
    assert until_answered(api, "paystack", resolved("ps-dr-3", 903, 4000)).json() == {"status": "debited"}
    # another amount: not the dispute's money
    assert until_answered(api, "paystack", refunded("ps-dr-3", "rf-903a", 3000)).json() == {"status": "debited"}
    # the dispute's refund, then a second refund of the same amount: only one is the dispute's
    assert until_answered(api, "paystack", refunded("ps-dr-3", "rf-903b", 4000)).json() == {"status": "duplicate"}
    assert until_answered(api, "paystack", refunded("ps-dr-3", "rf-903c", 2000)).json() == {"status": "debited"}
    assert balance(PAYER, "NGN") == 10000 - 4000 - 3000 - 2000
    assert wallet_invariant_breaches() == []


def test_two_same_amount_refunds_and_one_dispute_debit_twice(api):
    pay(api, "ps-dr-4", 10000)
    answers = at_once(
        api,
        "paystack",
        [refunded("ps-dr-4", "rf-904a", 4000), refunded("ps-dr-4", "rf-904b", 4000), resolved("ps-dr-4", 904, 4000)]
        * 3,
    )
    assert statuses(answers) == ["debited"] * 2 + ["duplicate"] * 7, answers
    assert balance(PAYER, "NGN") == 2000
    assert wallet_invariant_breaches() == []
