"""Cap leases against a real redis-server: all-or-nothing, exact refunds, breaker states."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from webhooks.caps import leases
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage.live import keys
from webhooks.storage.live.redis import make_store

BREAKER = {"breaker_failures": 3, "breaker_cooldown_ms": 400}
TTL = {"lease_ttl_ms": 10_000, "probe_ttl_ms": 10_000}
# Far ahead of the real clock: counters expire an hour after their window ends (EXPIREAT), so a
# window already past would vanish as soon as it is written.
NOW = datetime(2099, 11, 29, 12, 0, tzinfo=timezone.utc)


def rule(buyer_id="acme", price="10.00", tz="UTC", **limits) -> BuyerRule:
    from zoneinfo import ZoneInfo

    minor = {k: (int(Decimal(v) * 100) if k == "daily_budget" else v) for k, v in limits.items()}
    return BuyerRule(
        id=buyer_id,
        endpoint_url="http://x",
        priority=1,
        price=Decimal(price),
        price_minor=int(Decimal(price) * 100),
        tz=ZoneInfo(tz),
        limits=tuple(minor.items()),
        states=frozenset(),
        blocked=frozenset(),
        schedule=None,
    )


@pytest.fixture
def store(redis_server):
    s = make_store(redis_server.url)
    yield s
    s.redis.close()


@pytest.fixture
def r(store):
    return store.redis


def ready(r, *buyers):
    for b in buyers:
        leases.mark_ready(r, b.id)


def test_reserve_checks_every_cap_all_or_nothing_and_names_the_full_one(store, r):
    b = rule(hourly=5, daily=2, daily_budget="100.00")
    ready(r, b)
    assert leases.reserve(store, b, NOW, **TTL).status == "ok"
    assert leases.reserve(store, b, NOW, **TTL).status == "ok"
    refused = leases.reserve(store, b, NOW, **TTL)
    assert (refused.status, refused.cap) == ("full", "daily")
    # nothing was incremented by the refusal: the hourly counter still reads 2
    assert leases.usage(r, b, NOW)["hourly"]["used"] == 2
    assert leases.usage(r, b, NOW)["daily_budget"]["used"] == "20.00"


def test_budget_cap_counts_price_not_leads(store, r):
    b = rule(price="12.50", daily_budget="30.00")
    ready(r, b)
    assert [leases.reserve(store, b, NOW, **TTL).status for _ in range(3)] == ["ok", "ok", "full"]


def test_double_refund_of_one_lease_changes_nothing(store, r):
    b = rule(daily=1)
    ready(r, b)
    lease = leases.reserve(store, b, NOW, **TTL).lease
    assert leases.finish(store, lease, "error", **BREAKER) is True
    assert leases.finish(store, lease, "error", **BREAKER) is False
    assert leases.usage(r, b, NOW)["daily"]["used"] == 0
    other = leases.reserve(store, b, NOW, **TTL).lease
    assert leases.finish(store, lease, "rejected", **BREAKER) is False  # the old lease cannot refund it
    assert leases.usage(r, b, NOW)["daily"]["used"] == 1 and other


def test_confirmed_lease_cannot_be_refunded(store, r):
    b = rule(daily=1)
    ready(r, b)
    lease = leases.reserve(store, b, NOW, **TTL).lease
    assert leases.finish(store, lease, "accepted", **BREAKER) is True
    assert leases.finish(store, lease, "timeout", **BREAKER) is False
    assert leases.usage(r, b, NOW)["daily"]["used"] == 1


def test_refund_after_rollover_decrements_only_the_old_windows(store, r):
    b = rule(hourly=1, daily=5)
    ready(r, b)
    before = NOW.replace(hour=10, minute=59, second=59)
    after = before + timedelta(seconds=2)
    lease = leases.reserve(store, b, before, **TTL).lease
    assert leases.reserve(store, b, after, **TTL).status == "ok"  # new hour: a fresh hourly window
    assert leases.finish(store, lease, "error", **BREAKER)
    assert leases.usage(r, b, before)["hourly"]["used"] == 0
    assert leases.usage(r, b, after)["hourly"]["used"] == 1
    assert leases.usage(r, b, after)["daily"]["used"] == 1


def test_counters_expire_after_their_window(store, r):
    b = rule(hourly=3)
    ready(r, b)
    now = datetime.now(timezone.utc)
    leases.reserve(store, b, now, **TTL)
    (key,) = list(r.keys("fg:{b:acme}:cap:*"))
    ttl = r.ttl(key)
    window_end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    assert 0 < ttl <= (window_end - now).total_seconds() + leases.EXPIRY_GRACE.total_seconds() + 1


def test_unready_buyer_sells_nothing(store, r):
    b = rule(daily=10)
    assert leases.reserve(store, b, NOW, **TTL).status == "not_ready"
    assert r.keys("fg:{b:acme}:cap:*") == []


def test_concurrent_reservations_never_pass_the_cap(store, r, redis_server):
    b = rule(hourly=50, daily=40, daily_budget="10000.00")
    ready(r, b)
    results = []
    lock = threading.Lock()

    def worker():
        mine = make_store(redis_server.url)
        for _ in range(20):
            res = leases.reserve(mine, b, NOW, **TTL)
            with lock:
                results.append(res.status)

    threads = [threading.Thread(target=worker) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("ok") == 40 and len(results) == 800
    assert leases.usage(r, b, NOW)["daily"]["used"] == 40


def test_breaker_opens_half_opens_with_one_probe_and_closes(store, r):
    """A cool-down of a minute, so that a stalled test never finds the circuit half-open
    where it asserts it open; its end is brought forward in Redis instead of waited for."""
    b = rule()
    ready(r, b)
    minute = {**BREAKER, "breaker_cooldown_ms": 60_000}

    def cooled_down():
        left = int(r.hget(keys.breaker("acme"), "open_until")) - _redis_ms(r)
        assert 59_000 < left <= 60_000  # opened for the cool-down, from Redis's clock
        r.hset(keys.breaker("acme"), "open_until", 1)  # as if the minute had passed

    for _ in range(3):
        lease = leases.reserve(store, b, NOW, **TTL).lease
        leases.finish(store, lease, "timeout", **minute)
    assert leases.reserve(store, b, NOW, **TTL).status == "circuit_open"
    cooled_down()  # half-open
    probe = leases.reserve(store, b, NOW, **TTL)
    assert probe.status == "ok" and probe.lease.probe
    assert leases.reserve(store, b, NOW, **TTL).status == "circuit_open"  # one probe at a time
    leases.finish(store, probe.lease, "error", **minute)  # a failed probe opens it again
    assert leases.reserve(store, b, NOW, **TTL).status == "circuit_open"
    cooled_down()
    probe = leases.reserve(store, b, NOW, **TTL)
    leases.finish(store, probe.lease, "rejected", **minute)  # the buyer answered: closed
    assert r.exists(keys.breaker("acme")) == 0
    assert leases.reserve(store, b, NOW, **TTL).status == "ok"


def _redis_ms(r) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def test_rejections_do_not_count_as_failures(store, r):
    b = rule()
    ready(r, b)
    for outcome in ("error", "error", "rejected", "error", "error"):
        leases.finish(store, leases.reserve(store, b, NOW, **TTL).lease, outcome, **BREAKER)
    assert leases.reserve(store, b, NOW, **TTL).status == "ok"
