"""Buyers billed from one wallet (docs/api.md "Fifth round: the seams"), through the API with
the real Redis, database, RQ worker, payment webhooks and HTTP buyers: they draw on one balance,
so no sale takes the wallet below its floor, one lead after another or many at once, across
top-ups, returns and a lost dispute. The invariant checked after every step: for the wallet,
available = the ledger's wallet − everything held by every buyer on it ≥ the floor, and every
buyer of it shows the same figures."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest

from testkit.payments import at_once, deliver, encode, payload, with_metadata
from testkit.servers import wait_until
from tests.billing.test_charges import _post_many
from tests.conftest import CLUSTER
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Buyer, Lead, Wallet

pytestmark = pytest.mark.skipif(
    CLUSTER, reason="on a Redis Cluster a wallet is one buyer's alone (docs/cluster.md 'Wallets')"
)

ACCOUNT = "acme-wallet"
BUYERS = ("acme", "acme2", "acme3")


def _billing(**more) -> dict:
    return {"mode": "prepaid", "account": ACCOUNT, "currency": "USD", **more}


def _top_up(api, reference: str, cents: int) -> None:
    body = with_metadata("stripe", payload("stripe", reference, cents, "USD"), {"account_id": ACCOUNT})
    assert deliver(api, "stripe", encode(body)).json() == {"status": "credited"}


def _ledger() -> Decimal:
    with db.connection_context():
        row = Wallet.get_or_none(Wallet.customer == ACCOUNT, Wallet.currency == "USD")
    return Decimal(0) if row is None else Decimal(row.balance_minor) / 100


def _invariant(api, buyers: tuple[str, ...], floor: Decimal, *, debt: bool = False) -> dict:
    """Every buyer of the wallet shows one balance: the ledger's wallet, what all of them hold,
    and available = wallet − held − floor ≥ 0 (`debt`: a refund or lost dispute took the wallet
    below its floor, which no sale may do: then nothing is held and available < 0)."""
    shown = [api.get(f"/v1/admin/buyers/{b}").json()["balance"] for b in buyers]
    assert all(s == shown[0] for s in shown), shown
    wallet, reserved, available = (Decimal(shown[0][k]) for k in ("wallet", "reserved", "available"))
    assert wallet == _ledger()
    assert available == wallet - reserved - floor
    if debt:
        assert reserved == 0 and available < 0, shown[0]
    else:
        assert available >= 0, shown[0]
    return shown[0]


@pytest.fixture
def shared(api, buyer_server, reconfigure, worker):
    """Three buyers at 10.00 on one wallet (priorities 1-3, each at most 2 leads a day, so the
    waterfall reaches all of them), and an unbilled one at the end."""
    reconfigure(payment_account_field="account_id")
    key = api.put_publisher("surge")
    for priority, b in enumerate((*BUYERS, "spare"), start=1):
        buyer_server.add(b)
        billing = None if b == "spare" else _billing()
        caps = {"daily": 2} if b != "spare" else {}
        api.put_buyer(b, buyer_server.url(b), priority=priority, price="10.00", billing=billing, caps=caps)
    api.settle_config()
    return key


def _sold_to(api, key: str, lead_id: str) -> str | None:
    answer = api.post_lead(key, {"lead_id": lead_id, "state": "TX"}).json()
    api.wait_settled(lead_id, "surge")
    return answer.get("buyer_id")


def _settled(api) -> None:
    wait_until(
        lambda: api.get("/v1/admin/buyers/acme").json()["balance"]["reserved"] == "0.00",
        what="the sales' holds released by their settlement",
    )


def test_two_buyers_on_one_wallet_one_lead_after_another_stop_at_its_floor(api, shared):
    """The issue's case: a wallet of 25.00, two buyers at 10.00, six leads one after another."""
    _top_up(api, "pi_sw_1", 2500)
    got = []
    for i in range(6):
        got.append(_sold_to(api, shared, f"sw-{i}"))
        # the ledger has the sale before its settlement gives the hold back in Redis: the figures
        # agree again once it has (a view read between the two mixed a sale's two sides)
        _settled(api)
        _invariant(api, BUYERS, Decimal(0))
    assert got == ["acme", "acme", "spare", "spare", "spare", "spare"]
    skipped = api.wait_settled("sw-2", "surge")["skipped"]
    assert {"buyer_id": "acme2", "reason": "balance"} in skipped  # it had room, not the money
    _settled(api)
    assert _invariant(api, BUYERS, Decimal(0)) == {
        "currency": "USD",
        "available": "5.00",
        "wallet": "5.00",
        "reserved": "0.00",
    }


def test_three_buyers_on_one_wallet_across_returns_and_a_lost_dispute(api, shared):
    from tests.payments.test_disputes import stripe_dispute

    _top_up(api, "pi_1Dsp", 2000)  # the payment the dispute below is about
    _top_up(api, "pi_sw_2", 3000)
    got = [_sold_to(api, shared, f"tb-{i}") for i in range(7)]
    assert Counter(got) == {"acme": 2, "acme2": 2, "acme3": 1, "spare": 2}
    _settled(api)
    assert _invariant(api, BUYERS, Decimal(0))["wallet"] == "0.00"

    # a return credits its price back, and the next lead of the wallet's buyers takes it
    returned = next(f"tb-{i}" for i, b in enumerate(got) if b == "acme2")
    resp = api.http.post(f"{api.base}/v1/admin/leads/{returned}/return", json={}, headers=api.admin)
    assert resp.status_code == 200, resp.text
    assert _invariant(api, BUYERS, Decimal(0))["available"] == "10.00"
    assert _sold_to(api, shared, "tb-after-return") == "acme2"  # the return gave its slot back too
    _settled(api)
    _invariant(api, BUYERS, Decimal(0))

    # a lost dispute of a top-up takes the wallet below its floor: none of its buyers buys
    lost = stripe_dispute("charge.dispute.funds_withdrawn")
    assert [a["status"] for a in at_once(api, "stripe", [lost] * 3)].count("debited") == 1
    assert _invariant(api, BUYERS, Decimal(0), debt=True)["wallet"] == "-20.00"
    assert _sold_to(api, shared, "tb-after-dispute") == "spare"
    _invariant(api, BUYERS, Decimal(0), debt=True)
    _top_up(api, "pi_sw_3", 3000)  # pays the debt, and one lead more
    assert _invariant(api, BUYERS, Decimal(0))["available"] == "10.00"
    with db.connection_context():
        sold = Lead.select().where(Lead.buyer_id.in_(BUYERS), Lead.status == "sold").count()
    assert sold == 5  # six sold at 10.00 from 50.00 and a return's 10.00, one of them returned


@pytest.mark.parametrize(("buyers", "mode"), [(BUYERS[:2], "prepaid"), (BUYERS, "credit")])
def test_300_leads_at_once_to_buyers_on_one_wallet_spend_it_once(api, buyer_server, reconfigure, worker, buyers, mode):
    reconfigure(payment_account_field="account_id")
    key = api.put_publisher("surge")
    extra = {"credit_limit": "20.00"} if mode == "credit" else {}
    for priority, b in enumerate((*buyers, "spare"), start=1):
        buyer_server.add(b)
        billing = None if b == "spare" else {**_billing(), "mode": mode, **extra}
        api.put_buyer(b, buyer_server.url(b), priority=priority, price="10.00", billing=billing)
    api.settle_config()
    _top_up(api, "pi_sw_many", 5000)
    answers = _post_many(api, key, 300, "many")
    affordable = 7 if mode == "credit" else 5
    assert sum(1 for a in answers if a["buyer_id"] in buyers) == affordable
    for a in answers:
        if a["buyer_id"] in buyers:
            api.wait_settled(a["lead_id"], "surge")
    _settled(api)
    floor = Decimal(-20 if mode == "credit" else 0)
    shown = _invariant(api, buyers, floor)
    assert Decimal(shown["wallet"]) == 50 - 10 * affordable


def test_buyers_billed_from_one_wallet_at_once_all_get_one_floor(api, buyer_server):
    """Twenty buyers put at once on one new wallet, half with one credit limit and half with
    another: those written agree on one floor, and every other one was refused."""
    limits = ["10.00", "20.00"] * 10

    def put(i: int) -> int:
        body = {
            "name": f"b{i}",
            "endpoint_url": buyer_server.url(f"b{i}"),
            "price": "10.00",
            "billing": {**_billing(mode="credit"), "credit_limit": limits[i]},
        }
        with api.session() as s:
            return s.put(f"{api.base}/v1/admin/buyers/b{i}", json=body, headers=api.admin, timeout=30).status_code

    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(put, range(20)))
    assert set(codes) <= {200, 400}
    with db.connection_context():
        written = {row.id: row.billing for row in Buyer.select().where(Buyer.billing_account == f"{ACCOUNT}|USD")}
    assert len({json.loads(b)["credit_limit"] for b in written.values()}) == 1, written
    assert sorted(written) == sorted(f"b{i}" for i, code in enumerate(codes) if code == 200)
