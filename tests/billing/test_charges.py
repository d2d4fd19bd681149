"""Buyers that pay for their leads (docs/api.md "Buyer balances"), against the real Redis,
database, RQ worker and HTTP buyers: a top-up through the payment webhooks raises what the
buyer can spend, each sale draws its price in the cap reservation and debits the wallet at
settlement, a return credits it back, a refund of a top-up takes it away. The invariant after
every step: available = the ledger's wallet - what Redis holds for leases and unsettled sales
(and no sale past the floor)."""

from __future__ import annotations

import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from testkit.payments import at_once, deliver, encode, payload, refund_payload, with_metadata
from testkit.servers import wait_until
from tests.conftest import CLUSTER
from webhooks import services
from webhooks.caps import rebuild
from webhooks.leads.rules.catalog import load_snapshot
from webhooks.storage.live import keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, Wallet, WalletEntry

ACCOUNT = "buyer-acme"
PREPAID = {"mode": "prepaid", "account": ACCOUNT, "currency": "NGN", "low_balance": "20.00"}


def _top_up(api, reference: str, kobo: int, times: int = 1) -> list[dict]:
    body = with_metadata("paystack", payload("paystack", reference, kobo), {"account_id": ACCOUNT})
    return at_once(api, "paystack", [encode(body)] * times)


def _wallet() -> tuple[int, int]:
    """The ledger's wallet of ACCOUNT and the sum of its journal: always equal."""
    with db.connection_context():
        row = Wallet.get_or_none(Wallet.customer == ACCOUNT, Wallet.currency == "NGN")
        rows = WalletEntry.select().where(WalletEntry.customer == ACCOUNT, WalletEntry.currency == "NGN")
        return (0 if row is None else row.balance_minor), sum(e.amount_minor for e in rows)


def _balance(api) -> dict:
    return api.get("/v1/admin/buyers/acme").json()["balance"]


@pytest.fixture
def billed(api, buyer_server, reconfigure, worker):
    reconfigure(payment_account_field="account_id")
    acme, spare = buyer_server.add("acme"), buyer_server.add("spare")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"), priority=1, price="10.00", billing=PREPAID)
    api.put_buyer("spare", buyer_server.url("spare"), priority=2, price="5.00")
    api.settle_config()
    return key, acme, spare


def _post_many(api, key: str, n: int, prefix: str) -> list[dict]:
    start, local = threading.Barrier(min(n, 40)), threading.local()

    def one(i: int) -> dict:
        local.s = getattr(local, "s", None) or api.session()
        if i < 40:
            start.wait()
        resp = api.post_lead(key, {"lead_id": f"{prefix}-{i}", "state": "TX"}, session=local.s)
        assert resp.status_code == 200, resp.text
        return resp.json()

    with ThreadPoolExecutor(40) as pool:
        return list(pool.map(one, range(n)))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"mode": "postpaid", "account": ACCOUNT, "currency": "NGN"}, "billing.mode"),
        ({"mode": "prepaid", "account": ACCOUNT, "currency": "XYZ"}, "billing.currency"),
        ({"mode": "prepaid", "account": "", "currency": "NGN"}, "billing.account"),
        ({"mode": "prepaid", "account": ACCOUNT, "currency": "NGN", "credit_limit": "5.00"}, "billing.credit_limit"),
        ({"mode": "credit", "account": ACCOUNT, "currency": "NGN"}, "billing.credit_limit"),
        ({"mode": "credit", "account": ACCOUNT, "currency": "NGN", "credit_limit": "-1.00"}, "billing.credit_limit"),
        ({"mode": "credit", "account": ACCOUNT, "currency": "NGN", "credit_limit": 100}, "billing.credit_limit"),
        ({"mode": "prepaid", "account": ACCOUNT, "currency": "NGN", "low_balance": "1.001"}, "billing.low_balance"),
        ({"mode": "prepaid", "account": ACCOUNT, "currency": "JPY"}, "price"),  # 10.50 is no amount of yen
        ({"mode": "prepaid", "account": ACCOUNT, "currency": "NGN", "limit": "1"}, "billing.limit"),
        ("prepaid", "billing"),
    ],
)
def test_billing_is_validated_like_the_rest_of_the_buyer(api, buyer_server, body, field):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/acme",
        json={"name": "Acme", "endpoint_url": buyer_server.url("acme"), "price": "10.50", "billing": body},
        headers=api.admin,
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_buyer"
    assert resp.json()["error"]["message"].startswith(f"{field}:"), resp.text


def test_buyers_of_one_wallet_share_its_floor_and_on_a_cluster_none_shares_it(api, buyer_server):
    """A wallet has one floor: a second buyer with another credit limit (or mode) is refused,
    and nothing of it is written. On a Redis Cluster a wallet is one buyer's alone."""
    credit = {"mode": "credit", "account": ACCOUNT, "currency": "NGN", "credit_limit": "25.00"}
    api.put_buyer("acme", buyer_server.url("acme"), billing=credit)

    def put(buyer_id: str, billing: dict):
        body = {"name": buyer_id, "endpoint_url": buyer_server.url(buyer_id), "price": "10.00", "billing": billing}
        return api.http.put(f"{api.base}/v1/admin/buyers/{buyer_id}", json=body, headers=api.admin)

    refused = [{**credit, "credit_limit": "30.00"}, PREPAID]
    if CLUSTER:
        refused.append(credit)
    for billing in refused:
        resp = put("acme2", billing)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "invalid_buyer"
        field = "billing.account" if CLUSTER else "billing.credit_limit"
        assert resp.json()["error"]["message"].startswith(f"{field}:"), resp.text
        assert api.get("/v1/admin/buyers/acme2").status_code == 404  # nothing half-written
    assert put("acme2", {**PREPAID, "account": "another"}).status_code == 200  # another wallet
    assert put("acme", {**credit, "credit_limit": "40.00"}).status_code == 200  # its only buyer
    assert put("acme2", {**credit, "credit_limit": "40.00"}).status_code == (400 if CLUSTER else 200)


def test_a_buyer_not_billed_shows_no_balance(api, buyer_server):
    api.put_buyer("acme", buyer_server.url("acme"))
    shown = api.get("/v1/admin/buyers/acme").json()
    assert shown["billing"] is None and "balance" not in shown


def test_a_prepaid_buyer_gets_exactly_the_leads_its_top_up_pays_for(api, billed):
    key, acme, spare = billed
    assert _balance(api) == {"currency": "NGN", "available": "0.00", "wallet": "0.00", "reserved": "0.00"}
    # a top-up delivered five times at once is counted once
    answers = _top_up(api, "ps-topup-1", 5000, times=5)
    assert sorted(a["status"] for a in answers) == ["credited"] + ["duplicate"] * 4
    assert _wallet() == (5000, 5000)
    assert _balance(api)["available"] == "50.00"

    sold = _post_many(api, key, 60, "bl")
    by_buyer = Counter(a["buyer_id"] for a in sold)
    assert by_buyer == {"acme": 5, "spare": 55}
    assert acme.accepted == 5 and len(acme.received) == 5  # never offered a lead it could not pay for
    unpaid = next(a["lead_id"] for a in sold if a["buyer_id"] == "spare")
    trace = api.wait_settled(unpaid, "surge")["skipped"]
    assert {"buyer_id": "acme", "reason": "balance"} in trace

    for a in sold:
        api.wait_settled(a["lead_id"], "surge")
    wait_until(lambda: _balance(api)["reserved"] == "0.00", what="the sales' holds released by their settlement")
    assert _wallet() == (0, 0)
    assert _balance(api) == {"currency": "NGN", "available": "0.00", "wallet": "0.00", "reserved": "0.00"}
    with db.connection_context():
        charged = list(Lead.select().where(Lead.buyer_id == "acme"))
    assert {(lead.charge_account, lead.charge_minor) for lead in charged} == {(f"{ACCOUNT}|NGN", 1000)}

    # a return credits back exactly what its sale debited, and the buyer can buy again
    returned = next(a["lead_id"] for a in sold if a["buyer_id"] == "acme")
    resp = api.http.post(f"{api.base}/v1/admin/leads/{returned}/return", json={}, headers=api.admin)
    assert resp.status_code == 200, resp.text
    assert _wallet() == (1000, 1000)
    assert _balance(api)["available"] == "10.00"
    again = api.post_lead(key, {"lead_id": "bl-after-return", "state": "TX"}).json()
    assert again["buyer_id"] == "acme"
    api.wait_settled("bl-after-return", "surge")
    wait_until(lambda: _balance(api)["reserved"] == "0.00", what="the sale settled")
    assert _wallet() == (0, 0)


def test_a_payment_reads_no_buyer_unless_a_buyer_is_billed_from_its_wallet(api, billed, monkeypatch):
    """The config cache knows the wallets buyers are billed from: a payment to another wallet
    asks the database nothing about buyers; one to a billed wallet still raises the balance."""
    statements: list[str] = []
    real = db.obj.execute_sql

    def recorded(sql, params=None):
        statements.append(sql)
        return real(sql, params)

    monkeypatch.setattr(db.obj, "execute_sql", recorded)
    # the read of the buyers billed from one wallet (billing/balance.py sync_wallet); not the
    # config cache's own load of every buyer
    by_wallet = re.compile(r"FROM [`\"]buyers[`\"].*WHERE .*billing_account[`\"] = ")

    body = with_metadata("paystack", payload("paystack", "ps-not-billed", 5000), {"account_id": "someone-else"})
    assert deliver(api, "paystack", encode(body)).json()["status"] == "credited"
    assert statements, "the credit's own statements were recorded"
    assert not [sql for sql in statements if by_wallet.search(sql)]

    assert _top_up(api, "ps-billed", 2500)[0]["status"] == "credited"
    assert [sql for sql in statements if by_wallet.search(sql)]
    assert _balance(api)["available"] == "25.00"


def test_a_refunded_top_up_takes_the_balance_below_zero_and_the_buyer_gets_nothing(api, billed):
    key, acme, spare = billed
    _top_up(api, "ps-topup-2", 3000)
    first = api.post_lead(key, {"lead_id": "rf-1", "state": "TX"}).json()
    assert first["buyer_id"] == "acme"
    api.wait_settled("rf-1", "surge")
    refund = refund_payload("paystack", "rf-topup-2", "ps-topup-2", 3000)
    assert deliver(api, "paystack", encode(refund)).json() == {"status": "debited"}
    assert _wallet() == (-1000, -1000)
    wait_until(lambda: _balance(api)["available"] == "-10.00", what="the refund in the balance")
    assert api.post_lead(key, {"lead_id": "rf-2", "state": "TX"}).json()["buyer_id"] == "spare"
    _top_up(api, "ps-topup-3", 2000)  # pays the debt, and one lead more
    assert _balance(api)["available"] == "10.00"
    assert api.post_lead(key, {"lead_id": "rf-3", "state": "TX"}).json()["buyer_id"] == "acme"


def test_a_credit_buyer_may_go_down_to_its_limit_and_no_further(api, buyer_server, reconfigure, worker):
    reconfigure(payment_account_field="account_id")
    buyer_server.add("acme")
    key = api.put_publisher("surge")
    credit = {"mode": "credit", "account": ACCOUNT, "currency": "NGN", "credit_limit": "25.00"}
    api.put_buyer("acme", buyer_server.url("acme"), price="10.00", billing=credit)
    api.settle_config()
    answers = _post_many(api, key, 10, "cr")
    assert Counter(a["status"] for a in answers) == {"sold": 2, "unsold": 8}
    for a in answers:
        api.wait_settled(a["lead_id"], "surge")
    wait_until(lambda: _balance(api)["reserved"] == "0.00", what="the sales settled")
    assert _wallet() == (-2000, -2000)
    assert _balance(api)["available"] == "5.00"


def test_after_redis_lost_its_data_the_balance_is_rebuilt_from_the_ledger_and_the_queue(api, billed, worker_manager):
    """The wallet from the ledger, and held on top of it the price of a sale still queued (its
    settlement not written yet): the buyer can spend only what is left."""
    key, acme, spare = billed
    _top_up(api, "ps-topup-4", 3000)
    worker_manager.stop()  # the queued sale stays queued
    svc = services.of(api.app)
    queued = (
        '{"publisher_id":"surge","lead_id":"q-1","status":"sold","buyer_id":"acme","price":"10.00",'
        '"commission":"0.00","attempts":[],"skipped":[],"payload":"{}","received_at":"2099-01-01T00:00:00+00:00",'
        '"sold_at":"2099-01-01T00:00:00+00:00","lease":["acme","gone"],"reserved_us":1,"request_id":null,'
        '"charge":["buyer-acme|NGN",1000]}'
    )
    svc.queue_redis.redis.rpush(keys.SETTLE_PENDING, queued)
    svc.store.redis.delete(keys.ready("acme"))
    svc.store.redis.delete(svc.store.balance_key("acme", "buyer-acme|NGN"))  # what a restart without data loses
    # the test holds the rebuild lock, so the lead's refusal starts no rebuild in the background
    svc.store.redis.set(keys.rebuild_lock("acme"), "t")
    assert api.post_lead(key, {"lead_id": "lost-1", "state": "TX"}).json()["buyer_id"] == "spare"  # fail closed
    with db.connection_context():
        rule = next(b for b in load_snapshot(None).buyers if b.id == "acme")
    assert rebuild.rebuild(svc.store, svc.queue_redis.redis, rule, "t")
    assert _balance(api) == {"currency": "NGN", "available": "20.00", "wallet": "30.00", "reserved": "10.00"}


def test_a_lost_dispute_of_a_top_up_takes_it_from_the_balance_and_a_won_one_gives_it_back(
    api, buyer_server, reconfigure, worker
):
    from tests.payments.test_disputes import stripe_dispute

    reconfigure(payment_account_field="account_id")
    buyer_server.add("acme"), buyer_server.add("spare")
    key = api.put_publisher("surge")
    usd = {"mode": "prepaid", "account": ACCOUNT, "currency": "USD"}
    api.put_buyer("acme", buyer_server.url("acme"), priority=1, price="10.00", billing=usd)
    api.put_buyer("spare", buyer_server.url("spare"), priority=2)
    api.settle_config()
    top_up = with_metadata("stripe", payload("stripe", "pi_1Dsp", 2000, "USD"), {"account_id": ACCOUNT})
    assert deliver(api, "stripe", encode(top_up)).json() == {"status": "credited"}
    assert _balance(api)["available"] == "20.00"
    lost = stripe_dispute("charge.dispute.funds_withdrawn")
    assert [a["status"] for a in at_once(api, "stripe", [lost] * 3)].count("debited") == 1
    assert _balance(api) == {"currency": "USD", "available": "0.00", "wallet": "0.00", "reserved": "0.00"}
    assert api.post_lead(key, {"lead_id": "dp-1", "state": "TX"}).json()["buyer_id"] == "spare"
    won = stripe_dispute("charge.dispute.funds_reinstated", "won")
    assert deliver(api, "stripe", won).json() == {"status": "credited"}
    assert _balance(api)["available"] == "20.00"
    assert api.post_lead(key, {"lead_id": "dp-2", "state": "TX"}).json()["buyer_id"] == "acme"
