"""A lead is sold to at most one buyer even when a Floodgate process dies between a buyer's
answer and the publisher's (docs/api.md, "A lead is sold to at most one buyer").

The fast tests leave Redis as a routing that died mid-offer leaves it (its reservation and its
attempt note, written by the same functions the router uses; its claim expired) and post the
publisher's retry to the app in-process. The e2e tests kill -9 a real gunicorn worker while a
real buyer holds the lead, and send SIGTERM mid-delivery."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from decimal import Decimal

import pytest
import redis
import requests
from rq import Queue

import lua
from testkit.payments import child_pids
from testkit.servers import CutProxy, RedisServer, WebServer, wait_until
from tests.conftest import Api, Worker
from webhooks import services
from webhooks.caps import leases
from webhooks.leads.accounting.ledger import settle
from webhooks.leads.path import answers, recovery, settlement
from webhooks.leads.path.routing import Offer, Outcome, attempt_note, lead_ref
from webhooks.leads.posting.delivery import Deliverer
from webhooks.leads.rules.catalog import load_snapshot
from webhooks.storage.live import keys
from webhooks.storage.live.redis import Store
from webhooks.storage.live.settle_queue import SETTLE
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, LeadAttempt
from webhooks.storage.states import LeadStatus


def _die_while_offering(
    app, publisher_id: str, lead_id: str, buyer_id: str, attempts=(), payload: str | None = None
) -> leases.Lease:
    """What a routing leaves behind when its process dies after offering `lead_id` to
    `buyer_id`: the reservation and the attempt note (one round trip, as the router makes
    it), carrying the lead (`payload`, the publisher's body) when given; the claim has
    expired."""
    store = services.of(app).store
    with db.connection_context():
        [buyer] = [b for b in load_snapshot(None).buyers if b.id == buyer_id]
    ref = None if payload is None else lead_ref(publisher_id, lead_id, payload, "req-1")
    note = attempt_note(
        attempt_key=keys.lead_attempt(publisher_id, lead_id),
        offer=Offer(buyer, buyer.price),
        now=datetime.now(timezone.utc),
        attempts=list(attempts),
        ttl_ms=60_000,
        ref=ref,
    )
    reservation = leases.reserve(
        store, buyer, datetime.now(timezone.utc), lease_ttl_ms=60_000, probe_ttl_ms=60_000, note=note
    )
    assert reservation.status == "ok"
    return reservation.lease


def _setup_x_and_y(api: Api, buyer_server, x_mode: str = "accept"):
    x, y = buyer_server.add("x", x_mode), buyer_server.add("y")
    key = api.put_publisher("surge")
    api.put_buyer("x", buyer_server.url("x"), priority=1, caps={"daily": 1})
    api.put_buyer("y", buyer_server.url("y"), priority=2)
    api.settle_config()
    return key, x, y


def test_retry_after_a_dead_routing_offers_the_lead_to_the_same_buyer_who_confirms_it(api, app, buyer_server, worker):
    key, x, y = _setup_x_and_y(api, buyer_server)
    lease = _die_while_offering(app, "surge", "L1", "x", attempts=[{"buyer_id": "z", "outcome": "rejected", "ms": 7}])
    body = api.post_lead(key, {"lead_id": "L1", "state": "TX"}).json()
    assert (body["status"], body["buyer_id"], body["price"]) == ("sold", "x", "10.00")
    assert body["attempts"] == [
        {"buyer_id": "z", "outcome": "rejected", "ms": 7},
        {"buyer_id": "x", "outcome": "accepted", "ms": body["attempts"][1]["ms"]},
    ]
    assert y.received == []
    [offer] = x.received
    assert offer["headers"]["Idempotency-Key"] == "surge:L1:x" and offer["body"]["lead"] == {"state": "TX"}
    # Sold on the dead request's reservation: one slot of the daily cap of 1, counted once.
    usage = api.get("/v1/admin/buyers/x").json()["usage"]["daily"]
    assert usage["used"] == 1
    # confirmed (no refund can give the slot back), or already settled and released
    assert services.of(app).store.redis.hget(lease.key, "state") in ("confirmed", None)
    assert api.post_lead(key, {"lead_id": "L1"}).json()["replayed"] is True
    record = api.wait_settled("L1", "surge")
    assert record["status"] == "sold" and record["buyer_id"] == "x"


def test_a_retry_whose_reservation_left_with_its_settlement_answers_the_ledger_s_sale(api, app, buyer_server, worker):
    """A request that queued its sale's settlement and died before it stored the answer (the
    queue on a Redis of its own: settlement.end_lead), whose settlement the worker wrote and
    whose lease it released. The retry finds the reservation gone: the ledger's sale is the
    answer, as the ledger keeps it; x is not asked again, and its circuit, opened since, is
    left as it is (finishing a gone lease would have closed it: lua/finish_lease.lua)."""
    key, x, y = _setup_x_and_y(api, buyer_server)
    lease = _die_while_offering(app, "surge", "L9", "x", attempts=[{"buyer_id": "z", "outcome": "rejected", "ms": 7}])
    store = services.of(app).store
    with db.connection_context():
        snapshot = load_snapshot(None)
    [publisher] = [p for p in snapshot.publishers_by_key.values() if p.id == "surge"]
    sold = Outcome(
        status=LeadStatus.SOLD,
        buyer_id="x",
        price=Decimal("10.00"),
        sold_at=datetime.now(timezone.utc),
        lease=lease,
        attempts=[
            {"buyer_id": "z", "outcome": "rejected", "ms": 7},
            {"buyer_id": "x", "outcome": "accepted", "ms": 23},
        ],
    )
    item = settlement.make_item(
        publisher=publisher, lead_id="L9", outcome=sold, payload="{}", received_at=sold.sold_at, request_id=None
    )
    leases.finish(store, lease, "accepted", breaker_failures=3, breaker_cooldown_ms=1500)
    with db.connection_context():
        settle([item])  # what the worker does with the queued settlement, and then:
    leases.release_settled(store.redis, [(lease.buyer_id, lease.lease_id)])
    breaker = {"failures": "3", "open_until": str(int(time.time() * 1000) + 600_000)}
    store.redis.hset(keys.breaker("x"), mapping=breaker)  # x failed for others since

    body = api.post_lead(key, {"lead_id": "L9"}).json()
    assert (body["status"], body["buyer_id"], body["price"]) == ("sold", "x", "10.00")
    assert body["attempts"] == sold.attempts  # the ledger's, not a re-offer's
    assert x.received == [] and y.received == []
    assert store.redis.hgetall(keys.breaker("x")) == breaker
    assert api.post_lead(key, {"lead_id": "L9"}).json()["replayed"] is True
    record = api.wait_settled("L9", "surge")
    assert (record["status"], record["buyer_id"], len(record["attempts"])) == ("sold", "x", 2)


@pytest.mark.parametrize("answer", ["reject", "error500"])
def test_a_buyer_not_confirming_the_reoffer_leaves_the_lead_unsold_unknown_and_never_offers_another(
    api, app, buyer_server, worker, answer
):
    key, x, y = _setup_x_and_y(api, buyer_server, x_mode=answer)
    lease = _die_while_offering(app, "surge", "L2", "x")
    body = api.post_lead(key, {"lead_id": "L2"}).json()
    assert body["status"] == "unsold" and body["buyer_id"] is None
    assert [(a["buyer_id"], a["outcome"]) for a in body["attempts"]] == [("x", "unknown")]
    assert len(x.received) == 1 and y.received == []
    # The slot stays taken (x may hold the lead): only reconciliation gives it back.
    assert services.of(app).store.redis.hget(lease.key, "state") == "held"
    assert api.get("/v1/admin/buyers/x").json()["usage"]["daily"]["used"] == 1
    record = api.wait_settled("L2", "surge")
    assert record["status"] == "unsold" and record["review"] is True
    assert record["attempts"][-1]["outcome"] == "unknown"


def test_a_reservation_gone_before_the_retry_is_not_offered_again_nor_to_anyone_else(api, app, buyer_server):
    key, x, y = _setup_x_and_y(api, buyer_server)
    lease = _die_while_offering(app, "surge", "L3", "x")
    services.of(app).store.redis.delete(lease.key)  # expired: nobody can say whether x has the lead
    body = api.post_lead(key, {"lead_id": "L3"}).json()
    assert body["status"] == "unsold" and body["attempts"] == [{"buyer_id": "x", "outcome": "unknown", "ms": 0}]
    assert x.received == [] and y.received == []


def test_a_routing_that_ends_normally_leaves_no_attempt_note(api, app, buyer_server):
    key, x, y = _setup_x_and_y(api, buyer_server, x_mode="reject")
    assert api.post_lead(key, {"lead_id": "L4"}).json()["buyer_id"] == "y"
    assert api.post_lead(key, {"lead_id": "L5"}).json()["buyer_id"] == "y"
    r = services.of(app).store.redis
    assert r.exists(keys.lead_attempt("surge", "L4"), keys.lead_attempt("surge", "L5")) == 0


def test_leads_unknown_lists_the_leads_flagged_for_review(api, app, buyer_server, worker):
    key, x, y = _setup_x_and_y(api, buyer_server, x_mode="reject")
    _die_while_offering(app, "surge", "L6", "x")
    assert api.post_lead(key, {"lead_id": "L6"}).json()["attempts"][-1]["outcome"] == "unknown"
    assert api.post_lead(key, {"lead_id": "L7"}).json()["buyer_id"] == "y"
    api.wait_settled("L6", "surge")
    api.wait_settled("L7", "surge")
    result = app.test_cli_runner().invoke(args=["leads", "unknown"])
    assert result.exit_code == 0, result.output
    assert "surge" in result.output and "L6" in result.output and "L7" not in result.output
    page = api.get("/ops").text
    assert "L6" in page and "review" in page.lower()


def _sweep(app, after_ms: int = 0) -> recovery.SweepResult:
    """The scheduler's abandoned-lead sweep (workers/leads.py), in this process."""
    svc = services.of(app)
    return recovery.sweep_all(svc.config, svc.store, svc.queue_redis, svc.queue, after_ms)


def test_a_dead_routing_no_retry_comes_for_is_offered_again_and_sold_by_the_sweep(api, app, buyer_server, worker):
    key, x, y = _setup_x_and_y(api, buyer_server)
    lease = _die_while_offering(
        app,
        "surge",
        "A1",
        "x",
        attempts=[{"buyer_id": "z", "outcome": "rejected", "ms": 3}],
        payload='{"lead_id":"A1","state":"TX"}',
    )
    result = _sweep(app)
    assert (result.sold, result.unsold, result.left) == (["surge:A1"], [], 0)
    [offer] = x.received  # the re-offer: same key, same lead; nobody else asked
    assert offer["headers"]["Idempotency-Key"] == "surge:A1:x" and offer["body"]["lead"] == {"state": "TX"}
    assert y.received == []
    api.wait_settled("A1", "surge")
    with db.connection_context():
        lead = Lead.get(Lead.publisher_id == "surge", Lead.lead_id == "A1")
        assert (lead.status, lead.buyer_id, str(lead.price), lead.request_id) == ("sold", "x", "10.00", "req-1")
    r = services.of(app).store.redis
    wait_until(lambda: not r.exists(lease.key), what="the settled lease to be released")
    assert not r.exists(keys.lead_attempt("surge", "A1"))
    assert r.zscore(keys.leases("x"), lease.lease_id) is None
    assert api.get("/v1/admin/buyers/x").json()["usage"]["daily"]["used"] == 1  # counted once
    replay = api.post_lead(key, {"lead_id": "A1", "state": "TX"}).json()  # a late retry: the sweep's answer
    assert (replay["status"], replay["buyer_id"], replay["replayed"]) == ("sold", "x", True)
    assert [a["outcome"] for a in replay["attempts"]] == ["rejected", "accepted"]
    assert len(x.received) == 1
    assert _sweep(app).as_dict() == {"sold": 0, "unsold": 0, "left": 0}  # nothing twice


def test_a_sweep_sale_in_neither_queue_nor_ledger_is_not_counted_settled(
    api, app, buyer_server, worker_manager, refused_redis, database_down, caplog
):
    """The settlement queue on a Redis of its own, down, and the database down as the sweep
    sells an abandoned lead: the settlement is only in the log ("settlement LOST"). The sweep
    counts the lead left, not sold, and does not log it settled."""
    worker_manager.stop()
    key, x, y = _setup_x_and_y(api, buyer_server)
    _die_while_offering(app, "surge", "A8", "x", payload='{"lead_id":"A8"}')
    svc = services.of(app)
    snapshot = load_snapshot(None)
    down = Store(refused_redis)
    cfg = dataclasses.replace(svc.config, lead_abandoned_after_ms=0)
    sweeper = recovery.Sweeper(svc.store, down, Queue(SETTLE, connection=refused_redis), Deliverer(1500), cfg)
    with database_down(), caplog.at_level(logging.INFO, logger="webhooks"):
        result = sweeper.sweep(snapshot.buyers, ["x", "y"], {p.id: p for p in snapshot.publishers_by_key.values()})
    assert (result.sold, result.unsold, result.left) == ([], [], 1)
    assert len(x.received) == 1 and y.received == []  # x was asked and said yes
    assert "settlement LOST" in caplog.text and "not settled by this sweep" in caplog.text
    assert "by the sweep (its publisher never retried)" not in caplog.text


def test_the_sweep_leaves_a_lead_its_buyer_does_not_confirm_unsold_for_review(api, app, buyer_server, worker):
    key, x, y = _setup_x_and_y(api, buyer_server, x_mode="reject")
    lease = _die_while_offering(app, "surge", "A2", "x", payload='{"lead_id":"A2"}')
    assert _sweep(app).unsold == ["surge:A2"]
    assert len(x.received) == 1 and y.received == []
    record = api.wait_settled("A2", "surge")
    assert record["status"] == "unsold" and record["review"] is True
    assert record["attempts"] == [{"buyer_id": "x", "outcome": "unknown", "ms": record["attempts"][0]["ms"]}]
    assert services.of(app).store.redis.hget(lease.key, "state") == "held"  # x may hold it: reconciliation decides
    assert api.post_lead(key, {"lead_id": "A2"}).json()["status"] == "unsold"


def test_the_sweep_settles_a_confirmed_sale_without_asking_the_buyer_again(api, app, buyer_server, worker):
    key, x, y = _setup_x_and_y(api, buyer_server)
    lease = _die_while_offering(app, "surge", "A3", "x", payload='{"lead_id":"A3"}')
    # x said yes and the lease was confirmed, then the process died before the settlement
    leases.finish(services.of(app).store, lease, "accepted", breaker_failures=3, breaker_cooldown_ms=1000)
    r = services.of(app).store.redis
    r.hset(keys.breaker("x"), "failures", 2)  # x is failing now: an old accept must not close its breaker
    assert _sweep(app).sold == ["surge:A3"]
    assert x.received == [] and y.received == []
    assert r.hget(keys.breaker("x"), "failures") == "2"
    assert api.wait_settled("A3", "surge")["buyer_id"] == "x"


def test_a_sweep_outliving_its_claim_lets_its_sale_stand_beside_the_retry_that_took_the_claim(
    api, app, buyer_server, worker
):
    """The sweep runs outside gevent, where only socket timeouts bound a buyer's answer: its
    claim (201 ms here) expires while x takes 0.8 s, a publisher retry claims the lead and
    offers it to x again. Both hear `accepted`; the lead is sold once, to x, and the sweep
    writes over nothing the retry holds."""
    key, x, y = _setup_x_and_y(api, buyer_server, x_mode="sleep")
    x.delay = 0.8
    _die_while_offering(app, "surge", "D1", "x", payload='{"lead_id":"D1"}')
    ext, r = services.of(app), services.of(app).store.redis
    cfg = dataclasses.replace(
        services.of(app).config, lead_abandoned_after_ms=0, lead_claim_margin_ms=1, buyer_timeout_ms=100
    )
    with db.connection_context():
        snapshot = load_snapshot(None)
    publishers = {p.id: p for p in snapshot.publishers_by_key.values()}
    with ThreadPoolExecutor(1) as pool:
        sweeper = recovery.Sweeper(ext.store, ext.queue_redis, ext.queue, Deliverer(3000), cfg)
        sweeping = pool.submit(sweeper.sweep, snapshot.buyers, ["x", "y"], publishers)
        wait_until(lambda: x.arrived, what="the sweep's re-offer to reach x")
        wait_until(lambda: not r.exists(keys.lead_claim("surge", "D1")), what="the sweep's claim to expire")
        retry = api.post_lead(key, {"lead_id": "D1"}).json()
        result = sweeping.result(timeout=30)
    assert (retry["status"], retry["buyer_id"]) == ("sold", "x")
    assert result.sold == ["surge:D1"] and y.arrived == []
    assert len(x.arrived) == 2 and {o["headers"]["Idempotency-Key"] for o in x.arrived} == {"surge:D1:x"}
    assert api.wait_settled("D1", "surge")["buyer_id"] == "x"
    assert api.post_lead(key, {"lead_id": "D1"}).json()["buyer_id"] == "x"
    assert api.get("/v1/admin/buyers/x").json()["usage"]["daily"]["used"] == 1


def test_the_sweep_leaves_leads_a_request_holds_young_ones_and_notes_without_the_lead(api, app, buyer_server):
    x = buyer_server.add("x", "accept")
    api.put_publisher("surge")
    api.put_buyer("x", buyer_server.url("x"), caps={"daily": 10})
    api.settle_config()
    r = services.of(app).store.redis
    _die_while_offering(app, "surge", "B1", "x", payload='{"lead_id":"B1"}')
    r.set(keys.lead_claim("surge", "B1"), "routing:another-request", px=60_000)  # a retry routes it now
    _die_while_offering(app, "surge", "B2", "x")  # a note written before notes carried the lead
    _die_while_offering(app, "surge", "B3", "x", payload='{"lead_id":"B3"}')
    assert _sweep(app, after_ms=60_000).as_dict() == {"sold": 0, "unsold": 0, "left": 0}  # all too young
    assert _sweep(app).as_dict() == {"sold": 1, "unsold": 0, "left": 0}  # B3 only
    assert [o["body"]["lead_id"] for o in x.received] == ["B3"]
    assert r.exists(keys.lead_attempt("surge", "B1"), keys.lead_attempt("surge", "B2")) == 2


def test_a_retry_and_the_sweep_racing_for_one_abandoned_lead_sell_it_once(api, app, buyer_server, worker):
    """Twenty publisher retries and twenty sweeps at once, on one dead routing's lead: one of
    them claims it; the buyer is offered it again once; the ledger has it once."""
    key, x, y = _setup_x_and_y(api, buyer_server)
    _die_while_offering(app, "surge", "C1", "x", payload='{"lead_id":"C1"}')

    def retry():
        resp = api.post_lead(key, {"lead_id": "C1"})
        return resp.json() if resp.status_code == 200 else None

    with ThreadPoolExecutor(40) as pool:
        futures = [pool.submit(retry if i % 2 else _sweep, *(() if i % 2 else (app,))) for i in range(40)]
        results = [f.result() for f in futures]
    sold_by_sweeps = sum(len(res.sold) for res in results if isinstance(res, recovery.SweepResult))
    answers = [res for res in results if isinstance(res, dict)]
    assert len(x.received) == 1 and y.received == []
    assert all(a["buyer_id"] == "x" for a in answers)
    assert sold_by_sweeps + sum(1 for a in answers if not a.get("replayed")) == 1
    assert api.wait_settled("C1", "surge")["buyer_id"] == "x"  # by the sweep, or the retry's settlement
    with db.connection_context():
        assert Lead.select().where(Lead.lead_id == "C1").count() == 1


# --- real processes --------------------------------------------------------------------------


@pytest.fixture
def one_worker_web(base_env, tmp_path):
    """gunicorn with one gevent worker; short claims so a retry finds a dead one's soon."""
    env = {**base_env, "BUYER_TIMEOUT_MS": "1500", "LEAD_CLAIM_MARGIN_MS": "500"}
    server = WebServer(env, tmp_path / "web.log", workers=1)
    yield server
    server.stop()


def _post_until_answered(api: Api, key: str, lead_id: str, timeout: float = 30) -> dict:
    """Retry as a publisher does: the same lead_id on 409, 503 and connection errors."""

    def attempt():
        try:
            resp = api.post_lead(key, {"lead_id": lead_id})
        except requests.RequestException:  # the connection died with its worker
            return None
        return resp.json() if resp.status_code == 200 else None

    return wait_until(attempt, timeout=timeout, interval=0.2, what=f"an answer for {lead_id}")


# The settlement's LPUSH as redis-py writes it: where CutProxy kills a worker ending a sale.
SETTLEMENT_PUSH = b"*3\r\n$5\r\nLPUSH\r\n$%d\r\n%s\r\n" % (len(keys.SETTLE_PENDING), keys.SETTLE_PENDING.encode())


def _sell_into_the_kill(server: WebServer, proxy: CutProxy, buyer_server, lead_id: str):
    """x takes `lead_id` (y is second), and the server's one web worker is killed -9 where
    `proxy` cuts, as the sale ends: (api, publisher key, x, y)."""
    api = Api(server.url)
    key, x, y = _setup_x_and_y(api, buyer_server)
    [victim] = child_pids(server.pid)
    proxy.on_cut = lambda: os.kill(victim, signal.SIGKILL)
    _post_once_into_the_kill(api, key, lead_id)
    assert proxy.cut.is_set() and x.received  # killed as the sale ended
    return api, key, x, y


def _post_once_into_the_kill(api: Api, key: str, lead_id: str) -> None:
    """The publisher's first try, whose worker is killed under it: no answer comes back."""
    try:
        api.post_lead(key, {"lead_id": lead_id})
    except requests.RequestException:
        pass


@pytest.mark.e2e
@pytest.mark.parametrize("reoffer", ["accept", "reject"])
def test_worker_killed_after_the_buyer_got_the_lead_never_sells_it_to_another_buyer(
    one_worker_web, buyer_server, worker, reoffer
):
    api = Api(one_worker_web.url)
    key, x, y = _setup_x_and_y(api, buyer_server, x_mode="sleep")
    x.delay = 0.9  # x answers `accepted` after 0.9 s: into the void
    first = threading.Thread(target=_post_once_into_the_kill, args=(api, key, "K1"), daemon=True)
    first.start()
    wait_until(lambda: x.arrived, what="x to receive the lead")
    [victim] = child_pids(one_worker_web.pid)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: x.received, what="x to answer into the void")  # x will bill for it
    if reoffer == "reject":
        x.mode, x.delay = "reject", 0.0
    body = _post_until_answered(api, key, "K1")
    assert y.received == [] and y.arrived == []
    keys_seen = {r["headers"]["Idempotency-Key"] for r in x.arrived}
    assert keys_seen == {"surge:K1:x"} and len(x.arrived) == 2  # the first offer and the re-offer
    if reoffer == "accept":
        assert (body["status"], body["buyer_id"]) == ("sold", "x")
    else:
        assert body["status"] == "unsold" and body["attempts"][-1]["outcome"] == "unknown"
    record = api.wait_settled("K1", "surge")
    assert record["status"] == body["status"] and record["buyer_id"] == body["buyer_id"]


@pytest.mark.e2e
def test_worker_killed_after_the_buyer_accepted_and_no_retry_ever_comes_is_sold_by_the_sweep(
    one_worker_web, buyer_server, worker, redis_server, queue_server
):
    """What the 60-minute soak lost once: a web worker killed -9 right after its buyer
    accepted, and a publisher that never retried. The scheduler's sweep (the job it runs,
    on the real RQ worker) offers the lead again to that buyer alone and settles the sale."""
    api = Api(one_worker_web.url)
    key, x, y = _setup_x_and_y(api, buyer_server, x_mode="sleep")
    x.delay = 0.9
    first = threading.Thread(target=_post_once_into_the_kill, args=(api, key, "K9"), daemon=True)
    first.start()
    wait_until(lambda: x.arrived, what="x to receive the lead")
    [victim] = child_pids(one_worker_web.pid)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: x.received, what="x to accept into the void")
    x.delay = 0.0
    r = redis_server.client()
    wait_until(lambda: not r.exists(keys.lead_claim("surge", "K9")), timeout=20, what="the dead claim to expire")
    job = Queue(SETTLE, connection=redis.Redis.from_url(queue_server.url)).enqueue(
        "workers.leads.sweep_abandoned", after_ms=0
    )  # the scheduler's job, without its 2-minute wait
    assert wait_until(lambda: job.refresh() or job.return_value(), timeout=30, what="the sweep") == {
        "sold": 1,
        "unsold": 0,
        "left": 0,
    }

    def settled():
        with db.connection_context():
            return Lead.get_or_none(Lead.publisher_id == "surge", Lead.lead_id == "K9")

    lead = wait_until(settled, timeout=30, what="the drain to settle K9")
    assert (lead.status, lead.buyer_id) == ("sold", "x")
    assert y.arrived == [] and {r["headers"]["Idempotency-Key"] for r in x.arrived} == {"surge:K9:x"}
    assert len(x.arrived) == 2  # the first offer and the sweep's
    body = _post_until_answered(api, key, "K9")  # a retry long after: the sweep's answer
    assert (body["status"], body["buyer_id"], body["replayed"]) == ("sold", "x", True)
    assert len(x.arrived) == 2


@pytest.mark.e2e
def test_worker_killed_while_sending_the_end_of_a_sale_leaves_no_answer_without_its_settlement(
    base_env, tmp_path, buyer_server, worker, redis_server
):
    """What the one-minute soak lost once: the sale's end (the lease's script, about 6 KB, the
    publisher's answer, the settlement) is one pipeline that redis-py writes in two sends. A
    worker killed between them left the answer in Redis, so the retry replayed "sold", and
    the settlement never queued: a sale the ledger never heard of. The proxy cuts the worker's
    Redis connection where the settlement starts and the worker is killed there."""
    proxy = CutProxy("127.0.0.1", redis_server.port, SETTLEMENT_PUSH)
    env = {**base_env, "REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0", "BUYER_TIMEOUT_MS": "1500"}
    env["LEAD_CLAIM_MARGIN_MS"] = "500"  # short claims: the retry finds the dead one's soon
    server = WebServer(env, tmp_path / "web.log", workers=1)
    try:
        api, key, x, y = _sell_into_the_kill(server, proxy, buyer_server, "KC")
        body = _post_until_answered(api, key, "KC")
        assert (body["status"], body["buyer_id"]) == ("sold", "x")
        record = api.wait_settled("KC", "surge", timeout=30)
        assert (record["status"], record["buyer_id"]) == ("sold", "x")
        assert y.arrived == [] and {r["headers"]["Idempotency-Key"] for r in x.arrived} == {"surge:KC:x"}
    finally:
        server.stop()
        proxy.stop()


@pytest.mark.e2e
@pytest.mark.parametrize("cut", ["queueing the settlement", "storing the answer"])
def test_worker_killed_ending_a_sale_with_the_queue_on_a_redis_of_its_own_answers_sold_and_settles_it(
    base_env, tmp_path, buyer_server, redis_server, cut
):
    """With the settlement queue on a Redis of its own (RQ_REDIS_URL, as beside a cluster) no
    transaction spans the sale's end: it goes lease confirmed, settlement queued, answer
    stored. Killed as it queues the settlement (the order before stored the answer first: the
    retry replayed "sold" and the ledger never heard of the sale), the retry finds the lease
    confirmed. Killed as it stores the answer, after the settlement was queued and settled
    (its lease released with it), the retry finds the reservation gone and asks the ledger
    (answering "unsold" would contradict it). Either way: sold to x once, in the ledger."""
    queue = RedisServer(tmp_path / "queue-redis")
    queue.start()
    if cut == "queueing the settlement":
        proxy = CutProxy("127.0.0.1", queue.port, SETTLEMENT_PUSH)
        web_env = {**base_env, "RQ_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0"}
    else:
        sha = hashlib.sha1(lua.source("answer_lead").encode()).hexdigest().encode()
        proxy = CutProxy("127.0.0.1", redis_server.port, b"$7\r\nEVALSHA\r\n$40\r\n" + sha)
        web_env = {**base_env, "REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0", "RQ_REDIS_URL": queue.url}
    web_env |= {"BUYER_TIMEOUT_MS": "1500", "LEAD_CLAIM_MARGIN_MS": "500"}  # the retry finds the dead claim soon
    rq_worker = Worker({**base_env, "RQ_REDIS_URL": queue.url}, tmp_path, queue)
    server = WebServer(web_env, tmp_path / "web.log", workers=1)
    try:
        rq_worker.ensure()
        api, key, x, y = _sell_into_the_kill(server, proxy, buyer_server, "KQ")
        if cut == "storing the answer":
            api.wait_settled("KQ", "surge", timeout=30)
            r = redis.Redis.from_url(redis_server.url)
            # released by its settlement, right after the ledger's commit: the retry finds it gone
            wait_until(lambda: r.zcard(keys.leases("x")) == 0, what="the sale's lease released")
        body = _post_until_answered(api, key, "KQ")
        assert (body["status"], body["buyer_id"]) == ("sold", "x")
        record = api.wait_settled("KQ", "surge", timeout=30)
        assert (record["status"], record["buyer_id"]) == ("sold", "x")
        assert y.arrived == [] and len(x.arrived) == 1  # the retry asked x nothing
    finally:
        server.stop()
        rq_worker.stop()
        proxy.stop()
        queue.kill()


@pytest.mark.e2e
def test_sigterm_mid_delivery_lets_the_lead_finish_and_answers_its_publisher(base_env, tmp_path, buyer_server):
    server = WebServer({**base_env, "BUYER_TIMEOUT_MS": "3000"}, tmp_path / "web.log", workers=1)
    try:
        api = Api(server.url)
        x = buyer_server.add("x", "sleep", delay=1.5)
        key = api.put_publisher("surge")
        api.put_buyer("x", buyer_server.url("x"))
        api.settle_config()
        answer = {}
        sender = threading.Thread(target=lambda: answer.update(resp=api.post_lead(key, {"lead_id": "T1"})))
        sender.start()
        wait_until(lambda: x.arrived, what="x to receive the lead")
        os.kill(server.pid, signal.SIGTERM)  # a deploy
        sender.join(timeout=20)
        resp = answer["resp"]
        assert resp.status_code == 200 and resp.json()["status"] == "sold" and resp.json()["buyer_id"] == "x"
        server.proc.wait(timeout=20)
    finally:
        server.stop()


@pytest.mark.e2e
def test_thousand_leads_while_each_web_worker_is_killed_sell_each_lead_at_most_once(
    base_env, tmp_path, buyer_server, worker, record_property
):
    """1,000 leads from 50 threads across 2 web workers, each killed -9 in turn mid-run, with
    publishers retrying: no lead accepted by two buyers, no cap exceeded, and the ledger
    sells exactly what the buyers accepted (a repeated Idempotency-Key counted once)."""
    env = {**base_env, "BUYER_TIMEOUT_MS": "1500", "LEAD_CLAIM_MARGIN_MS": "500"}
    server = WebServer(env, tmp_path / "web.log", workers=2)
    try:
        api = Api(server.url)
        key = api.put_publisher("surge")
        caps = {"a": 60, "b": 60, "c": 60, "d": 60}
        for i, (name, cap) in enumerate(caps.items()):
            buyer_server.add(name, "sleep", delay=0.05 + 0.05 * i)
            api.put_buyer(name, buyer_server.url(name), priority=i + 1, caps={"daily": cap})
        api.settle_config()
        done = Counter()
        lock = threading.Lock()
        local = threading.local()

        def one(i: int) -> dict:
            s = getattr(local, "s", None) or requests.Session()
            local.s = s
            lead_id = f"k{i}"

            def attempt():
                try:
                    resp = s.post(
                        f"{server.url}/v1/leads",
                        json={"lead_id": lead_id},
                        timeout=30,
                        headers={"Authorization": f"Bearer {key}"},
                    )
                except requests.RequestException:  # the connection died with its worker
                    return None
                return resp.json() if resp.status_code == 200 else None

            body = wait_until(attempt, timeout=60, interval=0.2, what=f"an answer for {lead_id}")
            with lock:
                done["n"] += 1
            return body

        def killer():
            for threshold in (250, 600):
                wait_until(lambda t=threshold: done["n"] >= t, timeout=120, what=f"{threshold} answers")
                victims = child_pids(server.pid)
                os.kill(victims[0], signal.SIGKILL)
                wait_until(
                    lambda v=victims: len(set(child_pids(server.pid)) - set(v)) >= 1,
                    timeout=30,
                    what="gunicorn to replace the killed worker",
                )

        kill = threading.Thread(target=killer, daemon=True)
        kill.start()
        with ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(one, range(1000)))
        kill.join(timeout=5)

        accepted_by: dict[str, set[str]] = defaultdict(set)  # lead -> buyers that accepted it
        for name in caps:
            for rec in buyer_server.buyers[name].received:
                if rec["answered"] == "accept":
                    accepted_by[rec["body"]["lead_id"]].add(name)
        assert all(len(b) == 1 for b in accepted_by.values()), {k: v for k, v in accepted_by.items() if len(v) > 1}
        per_buyer = Counter(next(iter(b)) for b in accepted_by.values())
        assert all(per_buyer[name] <= cap for name, cap in caps.items()), per_buyer
        sold = {a["lead_id"]: a["buyer_id"] for a in answers if a["status"] == "sold"}
        assert sold == {lead: next(iter(b)) for lead, b in accepted_by.items()}
        unknown = [a for a in answers if any(t["outcome"] == "unknown" for t in a["attempts"])]
        record_property("sold", len(sold))
        record_property("reoffers", sum(len(r) > 1 for r in _offers(buyer_server, caps)))
        record_property("unknown", len(unknown))
        try:
            wait_until(lambda: _ledger_sold() == sold, timeout=60, what="the ledger to settle every answer")
        except AssertionError:
            ledger = _ledger_sold()
            missing = {k: v for k, v in sold.items() if ledger.get(k) != v}
            extra = {k: v for k, v in ledger.items() if k not in sold}
            raise AssertionError(
                f"ledger differs: {len(missing)} sold leads missing or other, {len(extra)} extra: "
                f"{list(missing.items())[:5]} {list(extra.items())[:5]}"
            ) from None
    finally:
        server.stop()


def _offers(buyer_server, caps) -> list[list[dict]]:
    """Per (lead, buyer): the offers made (a re-offer repeats the Idempotency-Key)."""
    by_key: dict[str, list[dict]] = defaultdict(list)
    for name in caps:
        for rec in buyer_server.buyers[name].arrived:
            by_key[rec["headers"]["Idempotency-Key"]].append(rec)
    return list(by_key.values())


def _ledger_sold() -> dict[str, str]:
    with db.connection_context():
        return {lead.lead_id: lead.buyer_id for lead in Lead.select().where(Lead.status == "sold")}


def test_unknown_attempts_are_stored_as_such(api, app, buyer_server, worker):
    key, x, y = _setup_x_and_y(api, buyer_server, x_mode="reject")
    _die_while_offering(app, "surge", "L8", "x")
    api.post_lead(key, {"lead_id": "L8"})
    api.wait_settled("L8", "surge")
    with db.connection_context():
        outcomes = [a.outcome for a in LeadAttempt.select().where(LeadAttempt.lead_id == "L8")]
    assert outcomes == ["unknown"]
    remembered = services.of(app).store.redis.get(keys.lead_claim("surge", "L8"))
    assert answers.recall(remembered, "L8", lambda: None)["status"] == "unsold"


def test_the_abandoned_lead_sweep_must_find_a_lease_before_it_expires():
    from webhooks import config

    assert config.load({}).lead_abandoned_after_ms == 120_000
    assert config.load({"LEAD_RECOVERY_WINDOW_MS": "100000"}).lead_abandoned_after_ms == 50_000
    assert config.load({"LEAD_ABANDONED_AFTER_MS": "5000"}).lead_abandoned_after_ms == 5000
    with pytest.raises(config.ConfigError, match="LEAD_ABANDONED_AFTER_MS"):
        config.load({"LEAD_RECOVERY_WINDOW_MS": "100000", "LEAD_ABANDONED_AFTER_MS": "50000"})
