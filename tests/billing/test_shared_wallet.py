"""Buyers billed from one wallet draw on one balance (docs/buyers.md "Balances"), against a
real redis-server and the ledger: a reservation of any of them sees the holds of all, a refund
gives a price back to the wallet it was held on (even after its buyer moved to another), and
the reconciliation counts every buyer's leases. The invariant checked: the wallet − everything
held by every buyer on it ≥ its floor."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.caps.test_leases import NOW, TTL, rule
from tests.conftest import CLUSTER
from webhooks.billing import balance
from webhooks.billing.balance import Billing
from webhooks.caps import leases
from webhooks.caps.reconcile import reconcile_balance
from webhooks.storage.live import keys
from webhooks.storage.live.redis import make_store
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Buyer

from .test_balance import PRICE, _billing, _fund

pytestmark = pytest.mark.skipif(
    CLUSTER, reason="on a Redis Cluster a wallet is one buyer's alone (docs/cluster.md 'Wallets')"
)


@pytest.fixture
def store(redis_server, app):
    s = make_store(redis_server.url, max_connections=64)
    yield s
    s.redis.close()


def _wallet(store, billing: Billing) -> tuple[int, int]:
    """The wallet's figure and everything held on it, as Redis has them."""
    wallet, held = store.redis.hmget(keys.wallet_balance(billing.key), "wallet", "held")
    return int(wallet), int(held or 0)


def _sale(buyer_id: str, lead_id: str, lease_id: str, billing: Billing) -> dict:
    """A sale in the settlement queue, its settlement not written yet."""
    return {
        "publisher_id": "p",
        "lead_id": lead_id,
        "status": "sold",
        "buyer_id": buyer_id,
        "price": "12.50",
        "sold_at": NOW.isoformat(),
        "lease": [buyer_id, lease_id],
        "reserved_us": 1,
        "charge": [billing.key, PRICE],
    }


def _reserve(store, b, billing: Billing):
    return leases.reserve(store, b, NOW, **TTL, hold=billing.hold(PRICE))


def _billed(store, *ids: str, billing: Billing) -> list:
    """Buyers billed from `billing`'s wallet, ready, the wallet known to Redis."""
    buyers = [dataclasses.replace(rule(i, daily=1000), billing=billing) for i in ids]
    for b in buyers:
        _stored(b.id, billing)
        leases.mark_ready(store.redis, b.id)
        balance.sync(store, b.id, billing, init=True)
    return buyers


def _stored(buyer_id: str, billing: Billing) -> None:
    """The buyer's row, billed from `billing`'s wallet (the reconciliation finds a wallet's
    buyers by it)."""
    fields = {"billing": billing.to_json(), "billing_account": billing.key}
    with db.connection_context():
        Buyer.insert(
            id=buyer_id,
            name=buyer_id,
            endpoint_url="http://x",
            priority=1,
            price="10.00",
            timezone="UTC",
            states="[]",
            blocked_publishers="[]",
            **fields,
        ).on_conflict_ignore().execute()
        Buyer.update(**fields).where(Buyer.id == buyer_id).execute()


@pytest.mark.parametrize(("mode", "credit", "affordable"), [("prepaid", 0, 5), ("credit", 2 * PRICE, 7)])
def test_300_reservations_at_once_across_three_buyers_spend_the_wallet_once(store, mode, credit, affordable):
    billing = _billing(mode, credit, account="shared")
    _fund(billing, 5 * PRICE)
    buyers = _billed(store, "acme", "acme2", "acme3", billing=billing)
    with ThreadPoolExecutor(50) as pool:
        statuses = list(pool.map(lambda i: _reserve(store, buyers[i % 3], billing).status, range(300)))
    assert statuses.count("ok") == affordable
    assert statuses.count("balance") == 300 - affordable
    wallet, held = _wallet(store, billing)
    assert (wallet, held) == (5 * PRICE, affordable * PRICE)
    assert wallet - held >= billing.floor_minor
    used = sum(leases.usage(store.redis, b, NOW)["daily"]["used"] for b in buyers)
    assert used == affordable  # caps and the one balance agree
    shown = {b.id: balance.shown(store, b.id, billing) for b in buyers}
    assert all(s == shown["acme"] for s in shown.values())  # every buyer sees the wallet's figures
    assert shown["acme"]["reserved"] == f"{affordable * PRICE / 100:.2f}"


def test_buyers_of_one_wallet_reserved_one_after_another_stop_at_its_floor(store):
    """The issue's case: two buyers at 12.50, a wallet of 31.25, leads one after another."""
    billing = _billing(account="sequential")
    _fund(billing, 2 * PRICE + PRICE // 2)
    acme, acme2 = _billed(store, "acme", "acme2", billing=billing)
    got = [_reserve(store, b, billing).status for b in (acme, acme, acme2, acme2, acme, acme2)]
    assert got == ["ok", "ok", "balance", "balance", "balance", "balance"]
    wallet, held = _wallet(store, billing)
    assert wallet - held == PRICE // 2


def test_a_refund_gives_the_price_back_to_the_wallet_it_was_held_on_after_a_move(store):
    """A buyer moved to another wallet while a lease of it was live: the lease's refund gives
    its price back to the first wallet, and the second never holds it (no leak, no loss)."""
    first, second = _billing(account="first"), _billing(account="second")
    _fund(first, 2 * PRICE)
    _fund(second, PRICE)
    (acme,) = _billed(store, "acme", billing=first)
    (other,) = _billed(store, "other", billing=first)
    live = _reserve(store, acme, first).lease
    assert _wallet(store, first) == (2 * PRICE, PRICE)
    moved = dataclasses.replace(acme, billing=second)
    _stored(acme.id, second)
    balance.sync(store, acme.id, second, init=True)
    assert _reserve(store, moved, second).status == "ok"  # the second wallet, its own price
    assert _reserve(store, moved, second).status == "balance"
    assert _reserve(store, other, first).status == "ok"  # the first still counts the live lease
    assert _reserve(store, other, first).status == "balance"
    assert leases.finish(store, live, "rejected", breaker_failures=3, breaker_cooldown_ms=400)
    assert _wallet(store, first) == (2 * PRICE, PRICE)  # given back where it was held
    assert _wallet(store, second) == (PRICE, PRICE)  # untouched


def test_a_sale_settled_from_another_wallet_releases_no_hold_it_never_took(store):
    first, second = _billing(account="from"), _billing(account="to")
    _fund(first, PRICE)
    _fund(second, 3 * PRICE)
    (acme,) = _billed(store, "acme", billing=first)
    sold = _reserve(store, acme, first).lease
    assert leases.finish(store, sold, "accepted", breaker_failures=3, breaker_cooldown_ms=400)
    _stored(acme.id, second)
    balance.sync(store, acme.id, second, init=True)
    held = _reserve(store, dataclasses.replace(acme, billing=second), second)
    assert held.status == "ok"
    _fund(second, -PRICE)  # the sale charged to the wallet the buyer is billed from now
    balance.sync(store, acme.id, second, [sold.lease_id])
    assert _wallet(store, second) == (2 * PRICE, PRICE)  # the live lease's hold stays
    assert _wallet(store, first) == (PRICE, PRICE)  # over-held, never under: reconciliation frees it


def test_reconciliation_counts_the_leases_of_every_buyer_of_the_wallet(store, redis_server):
    queue = redis_server.client(db=7)
    queue.flushdb()
    billing = _billing(account="reconciled")
    _fund(billing, 10 * PRICE)
    acme, acme2, acme3 = _billed(store, "acme", "acme2", "acme3", billing=billing)
    _reserve(store, acme, billing), _reserve(store, acme2, billing)
    sold = _reserve(store, acme3, billing).lease
    assert leases.finish(store, sold, "accepted", breaker_failures=3, breaker_cooldown_ms=400)
    store.redis.delete(sold.key)  # expired before its settlement: only the queue says it is held
    store.redis.zrem(keys.leases(acme3.id), sold.lease_id)
    queue.lpush(keys.SETTLE_PENDING, json.dumps(_sale(acme3.id, "l-1", sold.lease_id, billing)))
    store.redis.hset(keys.wallet_balance(billing.key), "held", 1)  # drifted
    with db.connection_context():
        found = reconcile_balance(store, queue, acme)  # any buyer of the wallet reconciles it all
    assert (found.status, found.held_before, found.held_now) == ("ok", 1, 3 * PRICE)
    assert _wallet(store, billing) == (10 * PRICE, 3 * PRICE)


def test_the_rebuild_of_one_buyer_holds_the_queued_sales_of_every_buyer_of_the_wallet(store, redis_server):
    from webhooks.caps import rebuild

    queue = redis_server.client(db=7)
    queue.flushdb()
    billing = _billing(account="rebuilt")
    _fund(billing, 3 * PRICE)
    acme, acme2 = (dataclasses.replace(rule(i, daily=10), billing=billing) for i in ("acme", "acme2"))
    queue.lpush(keys.SETTLE_PENDING, json.dumps(_sale(acme2.id, "q-1", "gone", billing)))
    store.redis.flushdb()  # the data loss (the queue is on a database of its own)
    for b in (acme, acme2):
        store.redis.set(keys.rebuild_lock(b.id), "t")
    with db.connection_context():
        assert rebuild.rebuild(store, queue, acme, "t")
        assert _wallet(store, billing) == (3 * PRICE, PRICE)  # acme2's queued sale held
        assert _reserve(store, acme, billing).status == "ok"
        assert rebuild.rebuild(store, queue, acme2, "t")  # finds the wallet rebuilt: left as it is
    assert _wallet(store, billing) == (3 * PRICE, 2 * PRICE)
    assert [_reserve(store, b, billing).status for b in (acme2, acme)] == ["ok", "balance"]


def test_a_buyer_unbilled_with_a_live_lease_gives_its_price_back_to_the_wallet(store):
    billing = _billing(account="unbilled")
    _fund(billing, PRICE)
    acme, acme2 = _billed(store, "acme", "acme2", billing=billing)
    live = _reserve(store, acme, billing).lease
    unbilled = dataclasses.replace(acme, billing=None)
    assert leases.reserve(store, unbilled, NOW, **TTL).status == "ok"  # holds nothing now
    assert _reserve(store, acme2, billing).status == "balance"  # the live lease still counts
    assert leases.finish(store, live, "rejected", breaker_failures=3, breaker_cooldown_ms=400)
    assert _wallet(store, billing) == (PRICE, 0)
    assert _reserve(store, acme2, billing).status == "ok"
