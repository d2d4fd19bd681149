"""A buyer's circuits in Redis (lua/reserve_lease.lua, lua/finish_lease.lua, caps/breaker.py):
one per publisher for failed replies, the buyer's own for everything else, each with its own
half-open probe."""

from __future__ import annotations

import threading

import pytest

from testkit.servers import wait_until
from tests.caps.test_leases import NOW, TTL, ready, rule
from webhooks.caps import leases
from webhooks.caps.breaker import breakers
from webhooks.storage.live import keys
from webhooks.storage.live.redis import make_store

BREAKER = {"breaker_failures": 3, "breaker_cooldown_ms": 400}


@pytest.fixture
def store(redis_server):
    s = make_store(redis_server.url)
    yield s
    s.redis.close()


@pytest.fixture
def r(store):
    return store.redis


def reserve(store, b, publisher_id):
    return leases.reserve(store, b, NOW, **TTL, publisher_id=publisher_id)


def fail(store, b, publisher_id, times=3, outcome="error", replied=True):
    for _ in range(times):
        lease = reserve(store, b, publisher_id).lease
        leases.finish(store, lease, outcome, **BREAKER, replied=replied)


def test_one_probe_per_circuit_under_concurrency(store, r, redis_server):
    """Half-open, the circuit for publisher A lets exactly one of many concurrent leads of A
    through; B's leads, whose circuit is closed, all pass at the same moment."""
    b = rule()
    ready(r, b)
    fail(store, b, "A")
    wait_until(lambda: breakers(r, ["acme"])["acme"].of("half_open") == ["A"], what="A's circuit half-open")
    results: list[tuple[str, str]] = []
    lock, start = threading.Lock(), threading.Barrier(40)

    def lead(publisher_id: str) -> None:
        own = make_store(redis_server.url)
        start.wait()
        got = reserve(own, b, publisher_id)
        with lock:
            results.append((publisher_id, got.circuit or got.status))
        own.redis.close()

    threads = [threading.Thread(target=lead, args=("A" if i % 2 else "B",)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count(("A", "ok")) == 1
    assert sorted(results).count(("A", "publisher")) == 19
    assert sorted(results).count(("B", "ok")) == 20


def test_withdrawing_a_probe_frees_its_slot_and_moves_no_circuit(store, r):
    """A lead Floodgate could not send (NOT_SENT) is withdrawn: neither circuit counts it, and
    a probe it was leaves its slot to the next lead."""
    b = rule()
    ready(r, b)
    fail(store, b, "A")
    wait_until(lambda: breakers(r, ["acme"])["acme"].of("half_open") == ["A"], what="A's circuit half-open")
    before = r.hgetall(keys.publisher_breaker("acme", "A"))
    probe = reserve(store, b, "A")
    assert probe.status == "ok" and probe.lease.probe
    assert reserve(store, b, "A").circuit == "publisher"  # one probe at a time
    leases.withdraw(store, probe.lease)
    assert r.hgetall(keys.publisher_breaker("acme", "A")) == before
    assert not r.exists(keys.breaker("acme"))
    assert reserve(store, b, "A").lease.probe  # the next lead is the probe


def test_a_failure_without_a_reply_counts_for_the_buyer_a_failed_reply_for_the_publisher(store, r):
    b = rule()
    ready(r, b)
    fail(store, b, "A", times=2, outcome="error", replied=False)  # refused, reset
    fail(store, b, "A", times=2, outcome="error", replied=True)  # a 5xx
    assert r.hget(keys.breaker("acme"), "failures") == "2"
    assert r.hget(keys.publisher_breaker("acme", "A"), "failures") == "2"
    fail(store, b, "B", times=1, outcome="timeout")
    assert reserve(store, b, "C").circuit == "buyer"  # 3 in a row, from two publishers


def test_an_answer_to_one_publishers_lead_leaves_the_others_circuits_counting(store, r):
    """Failures in a row are counted per circuit: B's accepted leads do not wipe A's count."""
    b = rule()
    ready(r, b)
    for _ in range(3):
        fail(store, b, "A", times=1)
        leases.finish(store, reserve(store, b, "B").lease, "accepted", **BREAKER)
    assert reserve(store, b, "A").circuit == "publisher"
    assert reserve(store, b, "B").status == "ok"
