"""A billed buyer's balance events (docs/api.md "Buyer balances"): `buyer.balance_low` once when
what it can spend first falls below its low_balance after a top-up, `buyer.balance_depleted`
once when a lead first skips it for its balance after a top-up, delivered to a subscribed
event endpoint. Against the real Redis, database, RQ worker (which settles the leads and
sends the events), HTTP buyers and a real receiver verifying each delivery."""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import datetime, timezone

import pytest

from testkit.events import EventReceiver
from testkit.servers import wait_until
from webhooks import services
from webhooks.leads.accounting.item import SettlementItem
from webhooks.storage.live import keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Event
from workers.settle import _settle

from .test_charges import PREPAID, _balance, _post_many, _top_up

SECRET = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
TYPES = ["buyer.balance_low", "buyer.balance_depleted"]


@pytest.fixture
def receiver():
    made = EventReceiver(SECRET)
    yield made
    made.close()


@pytest.fixture
def billed(api, buyer_server, reconfigure, worker, receiver):
    """acme pays 10.00 a lead from its wallet and is low under 20.00; spare is not billed; the
    application's endpoint wants the balance events only."""
    reconfigure(payment_account_field="account_id")
    acme, spare = buyer_server.add("acme"), buyer_server.add("spare")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"), priority=1, price="10.00", billing=PREPAID)
    api.put_buyer("spare", buyer_server.url("spare"), priority=2, price="5.00")
    body = {"url": receiver.url, "secret": SECRET, "types": TYPES}
    resp = api.http.put(f"{api.base}/v1/admin/event-endpoints/app", json=body, headers=api.admin)
    assert resp.status_code == 200, resp.text
    assert resp.json()["types"] == TYPES
    api.settle_config()
    return key, acme, spare


def _drained(api) -> bool:
    """Every queued settlement written and its batch done (balance events included)."""
    r = services.of(api.app).queue_redis.redis
    return not r.llen(keys.SETTLE_PENDING) and not list(r.scan_iter(match=keys.settle_processing("*")))


def _settle_all(api, answers: list[dict]) -> None:
    for a in answers:
        api.wait_settled(a["lead_id"], "surge")
    wait_until(lambda: _drained(api), what="the settlement batches done")


def _events() -> list[tuple[str, dict]]:
    """The balance events in the outbox, oldest first: (type, data)."""
    with db.connection_context():
        rows = Event.select().where(Event.type.in_(TYPES)).order_by(Event.id)
        return [(row.type, json.loads(row.body)["data"]) for row in rows]


def _received(receiver: EventReceiver) -> Counter:
    """Events the application accepted, counted once per webhook-id, by type."""
    return Counter({a.event_id: a.body["type"] for a in receiver.accepted()}.values())


def _one_by_one(api, key: str, prefix: str, n: int) -> list[dict]:
    answers = []
    for i in range(n):
        resp = api.post_lead(key, {"lead_id": f"{prefix}-{i}", "state": "TX"})
        assert resp.status_code == 200, resp.text
        answers.append(resp.json())
        _settle_all(api, answers[-1:])
    return answers


def test_each_event_goes_out_once_per_top_up_however_many_leads_cross_the_line(api, billed, receiver):
    key, acme, spare = billed
    low = {"buyer_id": "acme", "currency": "NGN", "available": "10.00"}
    depleted = {"buyer_id": "acme", "currency": "NGN", "available": "0.00"}

    _top_up(api, "ps-ev-1", 5000)  # five leads' worth
    sold = _one_by_one(api, key, "ev-a", 3)
    assert [a["buyer_id"] for a in sold] == ["acme"] * 3
    assert _balance(api)["available"] == "20.00" and _events() == []  # not below 20.00 yet
    sold = _one_by_one(api, key, "ev-b", 1)  # the fourth sale: 10.00 left
    assert _events() == [("buyer.balance_low", low)]

    # the fifth lead is the last acme can pay for; the rest skip it, batch after batch
    answers = _post_many(api, key, 30, "ev-c")
    assert Counter(a["buyer_id"] for a in answers) == {"acme": 1, "spare": 29}
    _settle_all(api, answers)
    answers = _one_by_one(api, key, "ev-d", 3)
    assert {a["buyer_id"] for a in answers} == {"spare"}
    assert _events() == [("buyer.balance_low", low), ("buyer.balance_depleted", depleted)]
    wait_until(lambda: _received(receiver) == {"buyer.balance_low": 1, "buyer.balance_depleted": 1}, what="both sent")
    assert [a.body["data"] for a in receiver.accepted()] == [low, depleted]  # in order, as written

    # a top-up starts the cycle again: one more of each when the line is crossed again
    _top_up(api, "ps-ev-2", 3000)
    answers = _one_by_one(api, key, "ev-e", 2)  # 30.00 -> 20.00 -> 10.00
    assert [a["buyer_id"] for a in answers] == ["acme", "acme"]
    answers = _one_by_one(api, key, "ev-f", 4)  # 0.00, then skipped three times
    assert [a["buyer_id"] for a in answers] == ["acme", "spare", "spare", "spare"]
    assert _events() == [
        ("buyer.balance_low", low),
        ("buyer.balance_depleted", depleted),
        ("buyer.balance_low", low),
        ("buyer.balance_depleted", depleted),
    ]
    wait_until(lambda: _received(receiver) == {"buyer.balance_low": 2, "buyer.balance_depleted": 2}, what="all sent")


def _skipped_item(lead_id: str) -> SettlementItem:
    """An unsold lead whose routing skipped acme for its balance, as the settlement list holds it."""
    now = datetime.now(timezone.utc).isoformat()
    return SettlementItem.from_dict(
        {
            "publisher_id": "surge",
            "lead_id": lead_id,
            "status": "unsold",
            "buyer_id": None,
            "price": None,
            "commission": None,
            "attempts": [],
            "skipped": [{"buyer_id": "acme", "reason": "balance"}],
            "payload": "{}",
            "received_at": now,
        }
    )


def test_a_batch_settled_twice_or_by_two_workers_at_once_writes_each_event_once(api, billed, receiver):
    key, acme, spare = billed
    _top_up(api, "ps-ev-3", 1500)  # one lead, 5.00 left: below 20.00
    _settle_all(api, _one_by_one(api, key, "tw-a", 1))
    assert [t for t, _ in _events()] == ["buyer.balance_low"]
    svc = services.of(api.app)
    batch = [_skipped_item("tw-1"), _skipped_item("tw-2")]
    lookup_key = svc.config.suppression_key.encode()
    start = threading.Barrier(4)

    def drain() -> None:
        start.wait()
        with db.connection_context():
            _settle(svc.store, svc.queue_redis.redis, batch, lookup_key=lookup_key)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with db.connection_context():
        _settle(svc.store, svc.queue_redis.redis, batch, lookup_key=lookup_key)  # and once more, after
    depleted = {"buyer_id": "acme", "currency": "NGN", "available": "5.00"}
    low = dict(depleted)
    assert _events() == [("buyer.balance_low", low), ("buyer.balance_depleted", depleted)]
    wait_until(lambda: _received(receiver) == {"buyer.balance_low": 1, "buyer.balance_depleted": 1}, what="both sent")


def test_a_publisher_endpoint_cannot_ask_for_buyer_events(api):
    body = {"url": "https://pub.example/pb", "publisher_id": "surge", "types": ["lead.sold", "buyer.balance_low"]}
    resp = api.http.put(f"{api.base}/v1/admin/event-endpoints/pb", json=body, headers=api.admin)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_endpoint"
