"""Three buyers billed from one wallet on the whole stack (docs/buyers.md "Balances"): gunicorn
with two gevent workers, the RQ worker, a private redis-server restarted empty, the database.
300 leads at once, then a return, a refund of a top-up and a data loss between further waves.
The invariant checked against the ledger after every step: the leads sold to the wallet's buyers
× their price ≤ what was paid into it, the wallet never below its floor but by a refund, and
every buyer of it showing the same balance: available = wallet − everything any of them holds."""

from __future__ import annotations

from collections import Counter

import pytest
import requests

from testkit.payments import deliver, encode, payload, refund_payload, with_metadata
from testkit.servers import wait_until
from tests.e2e.test_billing_stack import _post
from tests.e2e.test_payment_lifecycle import running_stack
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, Wallet, WalletEntry

pytestmark = pytest.mark.e2e

ACCOUNT = "shared-e2e"
BUYERS = ("acme", "acme2", "acme3")
CAPS = {"acme": {"daily": 2}, "acme2": {"daily": 2}, "acme3": {}}  # so sales land on all three


@pytest.fixture
def shared_stack(base_env, database_url, buyer_server, tmp_path):
    # 40 leads at a time on a busy 2-core machine: a buyer deadline well past what its posts
    # take, so that each lead is sold (to the wallet's buyers or to spare), never timed out
    extra = {"PAYMENT_ACCOUNT_FIELD": "account_id", "BUYER_TIMEOUT_MS": "5000", "CONFIG_CHECK_INTERVAL_MS": "100"}
    with running_stack(base_env, tmp_path, extra) as stack:
        admin = {"Authorization": f"Bearer {stack.env['ADMIN_TOKEN']}"}
        http = requests.Session()
        try:

            def put(path: str, body: dict) -> None:
                resp = http.put(stack.web.url + path, json=body, headers=admin, timeout=10)
                assert resp.status_code == 200, resp.text

            put("/v1/admin/publishers/surge", {"name": "Surge", "api_key": "pk_test_surge_0123456789"})
            billing = {"mode": "prepaid", "account": ACCOUNT, "currency": "NGN"}
            for priority, b in enumerate((*BUYERS, "spare"), start=1):
                buyer_server.add(b)
                body = {"name": b, "endpoint_url": buyer_server.url(b), "priority": priority, "timezone": "UTC"}
                if b != "spare":
                    body.update(billing=billing, caps=CAPS[b])
                put(f"/v1/admin/buyers/{b}", {**body, "price": "10.00"})
            stack.worker()
            yield stack, http, admin
        finally:
            http.close()  # an idle keep-alive connection would hold gunicorn's graceful stop (5 s)


def _top_up(base: str, reference: str, kobo: int) -> None:
    body = with_metadata("paystack", payload("paystack", reference, kobo), {"account_id": ACCOUNT})
    assert deliver(base, "paystack", encode(body)).json()["status"] == "credited"


def _ledger() -> tuple[int, int, int]:
    """The wallet's balance, the sum of its journal, and the leads the ledger holds sold to the
    wallet's buyers (returned ones not counted)."""
    with db.connection_context():
        row = Wallet.get_or_none(Wallet.customer == ACCOUNT, Wallet.currency == "NGN")
        journal = sum(e.amount_minor for e in WalletEntry.select().where(WalletEntry.customer == ACCOUNT))
        sold = Lead.select().where(Lead.buyer_id.in_(BUYERS), Lead.status == "sold").count()
    return (0 if row is None else row.balance_minor), journal, sold


def _invariant(http: requests.Session, base: str, admin: dict, *, top_ups: int, refunds: int = 0) -> dict:
    """The ledger and every buyer's balance after a step (kobo): the sales held by the ledger
    (a returned one credited back) never past the top-ups, the wallet what was paid in less
    what was refunded and sold, and available = wallet − held ≥ 0 unless a refund put the
    wallet in debt (then nothing is held)."""
    wallet, journal, sold = _ledger()
    assert wallet == journal
    assert sold * 1000 <= top_ups  # never sold past what was paid into the wallet
    assert wallet == top_ups - refunds - sold * 1000
    shown = [http.get(f"{base}/v1/admin/buyers/{b}", headers=admin, timeout=10).json()["balance"] for b in BUYERS]
    assert all(s == shown[0] for s in shown), shown
    assert shown[0]["wallet"] == f"{wallet / 100:.2f}"
    available, reserved = (round(float(shown[0][k]) * 100) for k in ("available", "reserved"))
    assert available == wallet - reserved
    assert (available < 0 and reserved == 0) if wallet < 0 else available >= 0, shown[0]
    return shown[0]


def _settled(http: requests.Session, base: str, admin: dict, sold: int) -> None:
    wait_until(lambda: _ledger()[2] == sold, timeout=60, what=f"{sold} sales in the ledger")
    wait_until(
        lambda: (
            http.get(f"{base}/v1/admin/buyers/acme", headers=admin, timeout=10).json()["balance"]["reserved"] == "0.00"
        ),
        timeout=30,
        what="the holds released by the settlements",
    )


def test_300_leads_at_once_to_three_buyers_of_one_wallet_spend_it_once(shared_stack, buyer_server):
    stack, http, admin = shared_stack
    base = stack.web.url
    _top_up(base, "sw-topup-1", 5000)  # five leads at 10.00, for the three buyers together
    answers = _post(base, 300, "sw")
    by_buyer = Counter(a["buyer_id"] for a in answers)
    assert sum(by_buyer[b] for b in BUYERS) == 5 and by_buyer["spare"] == 295, by_buyer
    assert sum(buyer_server.buyers[b].accepted for b in BUYERS) == 5
    _settled(http, base, admin, 5)
    assert _invariant(http, base, admin, top_ups=5000)["available"] == "0.00"

    # a return credits one price back: one more lead for the wallet's buyers, not two
    returned = next(a for a in answers if a["buyer_id"] in BUYERS)
    resp = http.post(f"{base}/v1/admin/leads/{returned['lead_id']}/return", json={}, headers=admin, timeout=10)
    assert resp.status_code == 200, resp.text
    assert _invariant(http, base, admin, top_ups=5000)["available"] == "10.00"
    again = Counter(a["buyer_id"] for a in _post(base, 100, "sw-again"))
    assert sum(again[b] for b in BUYERS) == 1, again
    _settled(http, base, admin, 5)
    _invariant(http, base, admin, top_ups=5000)

    # a refund of 20.00 of the top-up puts the wallet in debt: nothing sold until it is paid
    refund = refund_payload("paystack", "sw-rf-1", "sw-topup-1", 2000)
    assert deliver(base, "paystack", encode(refund)).json()["status"] == "debited"
    assert _invariant(http, base, admin, top_ups=5000, refunds=2000)["available"] == "-20.00"
    assert {a["buyer_id"] for a in _post(base, 50, "sw-debt")} == {"spare"}

    # Redis loses everything: nothing for the wallet's buyers until it is rebuilt, then as before
    stack.redis.restart_empty()
    # an RQ worker whose Redis went away mid-command may end (as it does in production, where the
    # Procfile's supervisor starts it again): start one, as test_payment_lifecycle does
    stack.worker()
    assert {a["buyer_id"] for a in _post(base, 20, "sw-lost")} == {"spare"}
    wait_until(
        lambda: all(
            http.get(f"{base}/v1/admin/buyers/{b}", headers=admin, timeout=10).json()["balance"]["available"]
            == "-20.00"
            for b in BUYERS
        ),
        timeout=60,
        what="the wallet's balance rebuilt",
    )
    _top_up(base, "sw-topup-2", 4000)  # pays the debt of 20.00, and two leads more
    assert _invariant(http, base, admin, top_ups=9000, refunds=2000)["available"] == "20.00"
    last = Counter(a["buyer_id"] for a in _post(base, 100, "sw-last"))
    assert sum(last[b] for b in BUYERS) == 2, last
    _settled(http, base, admin, 7)
    assert _invariant(http, base, admin, top_ups=9000, refunds=2000)["available"] == "0.00"
