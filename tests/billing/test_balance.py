"""A billed buyer's balance in the cap reservation, against a real redis-server and the
ledger's wallets: the price held in the same script as the caps, never past the floor at any
concurrency, given back on a refund, released once when the sale is in the ledger."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pytest

from tests.caps.test_leases import NOW, TTL, rule
from tests.conftest import CLUSTER
from webhooks.billing import balance, charges
from webhooks.billing.balance import Billing
from webhooks.billing.wallets import Entry
from webhooks.caps import leases
from webhooks.storage.live import keys
from webhooks.storage.live.redis import make_store
from webhooks.storage.live.scripts import LedgerBalance
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Wallet

PRICE = 1250  # minor units


@pytest.fixture
def store(redis_server, app):
    s = make_store(redis_server.url, max_connections=64)
    yield s
    s.redis.close()


def _billing(mode: str = "prepaid", credit: int = 0, account: str = "buyer-acme") -> Billing:
    return Billing(mode=mode, account=account, currency="USD", credit_limit_minor=credit)


def _fund(billing: Billing, minor: int) -> None:
    with db.atomic():
        kind = Entry.TOP_UP if minor > 0 else Entry.SALE
        charges.move(billing.account, billing.currency, minor, datetime.now(timezone.utc), entry=kind, reference="t")


def _held(store, buyer_id: str, billing: Billing) -> int:
    return int(store.redis.hget(store.balance_key(buyer_id, billing.key), "held") or 0)


def _reserve(store, b, billing: Billing):
    return leases.reserve(store, b, NOW, **TTL, hold=billing.hold(PRICE))


@pytest.mark.parametrize(("mode", "credit", "affordable"), [("prepaid", 0, 5), ("credit", 2 * PRICE, 7)])
def test_300_reservations_at_once_spend_exactly_what_the_balance_allows(store, mode, credit, affordable):
    b, billing = rule(daily=1000), _billing(mode, credit)
    leases.mark_ready(store.redis, b.id)
    _fund(billing, 5 * PRICE)
    balance.sync(store, b.id, billing, init=True)
    with ThreadPoolExecutor(50) as pool:
        statuses = list(pool.map(lambda _: _reserve(store, b, billing).status, range(300)))
    assert statuses.count("ok") == affordable
    assert statuses.count("balance") == 300 - affordable
    assert _held(store, b.id, billing) == affordable * PRICE
    assert leases.usage(store.redis, b, NOW)["daily"]["used"] == affordable  # caps and balance agree
    shown = balance.shown(store, b.id, billing)
    assert shown == {"currency": "USD", "available": "0.00", "wallet": "62.50", "reserved": f"{affordable * 12.5:.2f}"}


def test_a_refund_gives_the_price_back_and_a_sale_holds_it_until_the_ledger_has_it(store):
    b, billing = rule(daily=10), _billing()
    leases.mark_ready(store.redis, b.id)
    _fund(billing, 2 * PRICE)
    balance.sync(store, b.id, billing, init=True)
    refused, sold = _reserve(store, b, billing).lease, _reserve(store, b, billing).lease
    assert _reserve(store, b, billing).status == "balance"
    assert leases.finish(store, refused, "rejected", breaker_failures=3, breaker_cooldown_ms=400)
    assert leases.finish(store, refused, "rejected", breaker_failures=3, breaker_cooldown_ms=400) is False
    assert _held(store, b.id, billing) == PRICE  # given back once
    assert leases.finish(store, sold, "accepted", breaker_failures=3, breaker_cooldown_ms=400)
    assert _held(store, b.id, billing) == PRICE  # a sale keeps it held: the ledger has not debited it yet

    stale = balance.ledger_wallet(billing)
    _fund(billing, -PRICE)  # the settlement's debit, committed
    assert balance.sync(store, b.id, billing, [sold.lease_id])[:2] == (PRICE, 0)
    assert _reserve(store, b, billing).status == "ok"  # the wallet's last lead, held
    assert balance.sync(store, b.id, billing, [sold.lease_id])[:2] == (PRICE, PRICE)  # a repeat changes nothing
    assert store.sync_balance(b.id, stale)[:2] == (PRICE, PRICE)  # an older figure is not taken
    assert _reserve(store, b, billing).status == "balance"


def test_a_billed_buyer_whose_balance_is_not_known_is_sold_nothing(store):
    b, billing = rule(daily=10), _billing()
    leases.mark_ready(store.redis, b.id)
    _fund(billing, 100 * PRICE)
    assert _reserve(store, b, billing).status == "not_ready"
    balance.sync(store, b.id, billing)  # a ledger change does not make the balance known
    assert _reserve(store, b, billing).status == "not_ready"
    balance.sync(store, b.id, billing, init=True)
    assert _reserve(store, b, billing).status == "ok"


def test_a_buyer_not_billed_is_not_held_against_any_balance(store):
    b = rule(daily=10)
    leases.mark_ready(store.redis, b.id)
    assert leases.reserve(store, b, NOW, **TTL).status == "ok"
    assert not store.redis.exists(keys.balance(b.id))


def test_the_rebuild_after_a_data_loss_sets_the_balance_from_the_ledger(store):
    b, billing = rule(daily=10), _billing()
    _fund(billing, 3 * PRICE)
    store.redis.flushall()
    store.redis.set(keys.rebuild_lock(b.id), "t")
    with db.connection_context():
        wallet = balance.ledger_wallet(billing, unsettled_minor=2 * PRICE)  # two sales still queued
    assert store.rebuild_counters(b.id, "t", [], wallet)
    assert [_reserve(store, b, billing).status for _ in range(2)] == ["ok", "balance"]


def test_each_move_of_a_wallet_counts_one_version(store):
    billing = _billing(account="versions")
    _fund(billing, 500)
    _fund(billing, -200)
    with db.connection_context():
        row = Wallet.get(Wallet.customer == "versions")
    assert (row.balance_minor, row.version) == (300, 2)
    assert balance.ledger_wallet(billing) == LedgerBalance("versions|USD", 300, 2, 0)


def test_a_cycle_starts_when_billed_and_at_each_sync_that_leaves_more_to_spend(store):
    """The balance events' cycle (lua/sync_balance.lua): a sale's debit and the release of its
    hold leave the cycle as it was, a top-up starts one at its version, a stale figure does not."""
    b, billing = rule(daily=10), _billing(account="cycles")
    leases.mark_ready(store.redis, b.id)
    _fund(billing, 3 * PRICE)  # version 1
    assert balance.sync(store, b.id, billing, init=True) == (3 * PRICE, 0, 1)
    sold = _reserve(store, b, billing).lease
    assert leases.finish(store, sold, "accepted", breaker_failures=3, breaker_cooldown_ms=400)
    stale = balance.ledger_wallet(billing)
    _fund(billing, -PRICE)  # version 2: the sale's debit
    assert balance.sync(store, b.id, billing, [sold.lease_id]) == (2 * PRICE, 0, 1)  # same cycle
    _fund(billing, 5 * PRICE)  # version 3: a top-up
    assert balance.sync(store, b.id, billing) == (7 * PRICE, 0, 3)
    assert balance.sync(store, b.id, billing) == (7 * PRICE, 0, 3)  # a repeat: the same cycle
    assert store.sync_balance(b.id, stale) == (7 * PRICE, 0, 3)
    # a top-up and a sale settled together, whose figure the sale's sync takes: still a raise
    sold = _reserve(store, b, billing).lease
    assert leases.finish(store, sold, "accepted", breaker_failures=3, breaker_cooldown_ms=400)
    _fund(billing, 2 * PRICE)  # version 4
    _fund(billing, -PRICE)  # version 5
    assert balance.sync(store, b.id, billing, [sold.lease_id]) == (8 * PRICE, 0, 5)
    # a refund of a top-up leaves less to spend: the same cycle
    _fund(billing, -4 * PRICE)  # version 6
    assert balance.sync(store, b.id, billing) == (4 * PRICE, 0, 5)
    # a balance rebuilt after a data loss has no cycle: its next sync starts one at its version
    store.redis.hdel(store.balance_key(b.id, billing.key), "cycle")
    assert balance.held_now(store, [(b.id, billing)]) == {}
    assert balance.sync(store, b.id, billing) == (4 * PRICE, 0, 6)
    assert balance.held_now(store, [(b.id, billing), ("nobody", _billing(account="nobody"))]) == {
        b.id: (4 * PRICE, 0, 6)
    }


def test_reconciliation_holds_exactly_what_live_leases_and_queued_sales_hold(store, redis_server):
    from webhooks.caps.reconcile import reconcile_balance

    # The queue on a Redis database of its own: the run's RQ worker (started by an earlier test
    # under xdist) drains db 0, and would take the hand-made sale below into a batch of its own
    # (a cluster run's worker drains the single Redis beside the cluster).
    queue = store.redis
    if not CLUSTER:
        queue = redis_server.client(db=7)
        queue.flushdb()
    b, billing = rule(daily=10), _billing()
    b = dataclasses.replace(b, billing=billing)
    leases.mark_ready(store.redis, b.id)
    _fund(billing, 5 * PRICE)
    balance.sync(store, b.id, billing, init=True)
    live = _reserve(store, b, billing).lease
    sold = _reserve(store, b, billing).lease
    assert leases.finish(store, sold, "accepted", breaker_failures=3, breaker_cooldown_ms=400)
    # the sale's lease expires before its settlement is written: only the queue says it is held
    store.redis.delete(sold.key)
    store.redis.zrem(keys.leases(b.id), sold.lease_id)
    item = {
        "publisher_id": "p",
        "lead_id": "l-1",
        "status": "sold",
        "buyer_id": b.id,
        "lease": [b.id, sold.lease_id],
        "charge": [billing.key, PRICE],
    }
    queue.lpush(keys.SETTLE_PENDING, json.dumps(item))
    store.redis.hset(store.balance_key(b.id, billing.key), "held", 7)  # drifted
    with db.connection_context():
        found = reconcile_balance(store, queue, b)
    assert (found.status, found.held_before, found.held_now) == ("ok", 7, 2 * PRICE)
    assert _held(store, b.id, billing) == 2 * PRICE  # the live lease and the queued sale
    # the sale settled (the ledger debited it) but the sync that releases it was lost
    queue.delete(keys.SETTLE_PENDING)
    _fund(billing, -PRICE)
    with db.connection_context():
        found = reconcile_balance(store, queue, b)
    assert (found.held_now, _held(store, b.id, billing)) == (PRICE, PRICE)  # the live lease only
    assert (
        int(store.redis.hget(store.balance_key(b.id, billing.key), "wallet")) == 4 * PRICE
    )  # the ledger's newer figure
    assert leases.finish(store, live, "rejected", breaker_failures=3, breaker_cooldown_ms=400)
    assert _held(store, b.id, billing) == 0
