"""Buyer balances on the whole stack (docs/buyers.md "Balances"): gunicorn with two gevent
workers, the RQ worker killed -9, a private redis-server restarted empty, the database. The
balance invariant holds after every step: no lead sold past what the buyer paid for, each
change of the wallet counted once, available = the ledger's wallet - what is held."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from testkit.payments import deliver, encode, payload, refund_payload, with_metadata
from testkit.servers import wait_until
from tests.e2e.test_payment_lifecycle import running_stack
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, Wallet, WalletEntry

pytestmark = pytest.mark.e2e

ACCOUNT = "buyer-e2e"


@pytest.fixture
def billed_stack(base_env, database_url, buyer_server, tmp_path):
    extra = {"PAYMENT_ACCOUNT_FIELD": "account_id", "BUYER_TIMEOUT_MS": "500", "CONFIG_CHECK_INTERVAL_MS": "100"}
    with running_stack(base_env, tmp_path, extra) as stack:
        admin = {"Authorization": f"Bearer {stack.env['ADMIN_TOKEN']}"}
        http = requests.Session()
        try:

            def put(path: str, body: dict) -> None:
                resp = http.put(stack.web.url + path, json=body, headers=admin, timeout=10)
                assert resp.status_code == 200, resp.text

            buyer_server.add("acme"), buyer_server.add("spare")
            put("/v1/admin/publishers/surge", {"name": "Surge", "api_key": "pk_test_surge_0123456789"})
            billing = {"mode": "prepaid", "account": ACCOUNT, "currency": "NGN"}
            common = {"timezone": "UTC", "price": "10.00"}
            put(
                "/v1/admin/buyers/acme",
                {"name": "Acme", "endpoint_url": buyer_server.url("acme"), "priority": 1, "billing": billing, **common},
            )
            put(
                "/v1/admin/buyers/spare",
                {"name": "Spare", "endpoint_url": buyer_server.url("spare"), "priority": 2, **common},
            )
            stack.worker()
            yield stack, http, admin
        finally:
            http.close()  # an idle keep-alive connection would hold gunicorn's graceful stop (5 s)


def _top_up(base: str, reference: str, kobo: int) -> None:
    body = with_metadata("paystack", payload("paystack", reference, kobo), {"account_id": ACCOUNT})
    assert deliver(base, "paystack", encode(body)).json()["status"] in ("credited", "duplicate")


def _post(base: str, n: int, prefix: str, threads: int = 40) -> list[dict]:
    start, local = threading.Barrier(min(n, threads)), threading.local()
    sessions: list[requests.Session] = []

    def one(i: int) -> dict:
        if getattr(local, "s", None) is None:
            local.s = requests.Session()
            sessions.append(local.s)
        if i < threads:
            start.wait()
        while True:  # a publisher retries a 409 (in flight) or 503
            resp = local.s.post(
                f"{base}/v1/leads",
                json={"lead_id": f"{prefix}-{i}", "state": "TX"},
                headers={"Authorization": "Bearer pk_test_surge_0123456789"},
                timeout=30,
            )
            if resp.status_code == 200:
                return resp.json()
            assert resp.status_code in (409, 503), resp.text

    try:
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(one, range(n)))
    finally:
        for s in sessions:  # an idle keep-alive connection would hold gunicorn's graceful stop
            s.close()


def _ledger() -> tuple[int, int, int]:
    """The wallet's balance, the sum of its journal, and the leads sold to acme in the ledger."""
    with db.connection_context():
        row = Wallet.get_or_none(Wallet.customer == ACCOUNT, Wallet.currency == "NGN")
        journal = sum(e.amount_minor for e in WalletEntry.select().where(WalletEntry.customer == ACCOUNT))
        sold = Lead.select().where(Lead.buyer_id == "acme").count()
    return (0 if row is None else row.balance_minor), journal, sold


def _balance(http: requests.Session, base: str, admin: dict) -> dict:
    return http.get(f"{base}/v1/admin/buyers/acme", headers=admin, timeout=10).json()["balance"]


def _shown(available: str, wallet: str, reserved: str) -> dict:
    return {"currency": "NGN", "available": available, "wallet": wallet, "reserved": reserved}


def test_300_leads_across_two_web_processes_buy_exactly_what_the_top_up_paid_for(billed_stack, buyer_server):
    stack, http, admin = billed_stack
    base = stack.web.url
    _top_up(base, "e2e-topup-1", 5000)  # five leads at 10.00
    wait_until(lambda: _balance(http, base, admin)["available"] == "50.00", what="the top-up in the balance")
    answers = _post(base, 300, "e2e")
    assert Counter(a["buyer_id"] for a in answers) == {"acme": 5, "spare": 295}
    assert buyer_server.buyers["acme"].accepted == 5
    assert len(buyer_server.buyers["acme"].received) == 5  # never posted a lead it could not pay for
    wait_until(lambda: _ledger()[2] == 5 and _ledger()[0] == 0, timeout=60, what="the five sales debited")
    wait_until(lambda: _balance(http, base, admin)["reserved"] == "0.00", what="the holds released")
    assert _ledger() == (0, 0, 5)
    assert _balance(http, base, admin) == _shown("0.00", "0.00", "0.00")


def test_a_worker_killed_between_a_sale_and_its_settlement_debits_it_once(billed_stack):
    stack, http, admin = billed_stack
    base = stack.web.url
    _top_up(base, "e2e-topup-2", 2000)
    wait_until(lambda: _balance(http, base, admin)["available"] == "20.00", what="the top-up in the balance")
    for proc in stack.procs:
        proc.stop(sig=9)  # kill -9: the sale stays queued, its price held
    assert [a["buyer_id"] for a in _post(base, 1, "killed")] == ["acme"]
    assert _balance(http, base, admin) == {
        "currency": "NGN",
        "available": "10.00",
        "wallet": "20.00",
        "reserved": "10.00",
    }
    stack.worker()
    wait_until(lambda: _ledger() == (1000, 1000, 1), timeout=60, what="the sale settled by the new worker")
    wait_until(lambda: _balance(http, base, admin)["reserved"] == "0.00", what="its hold released")
    assert _balance(http, base, admin) == {
        "currency": "NGN",
        "available": "10.00",
        "wallet": "10.00",
        "reserved": "0.00",
    }


def test_after_redis_restarts_empty_a_buyer_in_debt_gets_nothing_before_or_after_the_rebuild(billed_stack):
    stack, http, admin = billed_stack
    base = stack.web.url
    _top_up(base, "e2e-topup-3", 1000)
    wait_until(lambda: _balance(http, base, admin)["available"] == "10.00", what="the top-up in the balance")
    assert [a["buyer_id"] for a in _post(base, 1, "debt")] == ["acme"]
    wait_until(lambda: _ledger() == (0, 0, 1), timeout=60, what="the sale settled")
    refund = refund_payload("paystack", "e2e-rf-3", "e2e-topup-3", 1000)
    assert deliver(base, "paystack", encode(refund)).json()["status"] == "debited"
    assert _ledger() == (-1000, -1000, 1)
    stack.redis.restart_empty()
    # before the rebuild: nothing for acme (fail closed); after it: still nothing (in debt)
    assert {a["buyer_id"] for a in _post(base, 10, "after-loss")} == {"spare"}
    wait_until(lambda: _balance(http, base, admin)["available"] is not None, timeout=60, what="the balance rebuilt")
    assert _balance(http, base, admin) == {
        "currency": "NGN",
        "available": "-10.00",
        "wallet": "-10.00",
        "reserved": "0.00",
    }
    assert {a["buyer_id"] for a in _post(base, 10, "rebuilt")} == {"spare"}
    assert _ledger() == (-1000, -1000, 1)
