"""Fail closed after Redis lost data: a buyer whose `ready` key is gone sells nothing until its
counters of the current windows are rebuilt from the ledger plus the unsettled sales.

The rebuild waits one delivery deadline and SETTLE_MARGIN_S first, so every lease taken before
the loss has finished and its sale (if any) is in the ledger or in the settlement queue (a
journal pushed again) when we count. Part of the recovery from a Redis data loss: see
docs/architecture.md "When Redis loses its data".
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from webhooks.billing.balance import Billing
from webhooks.caps import dedupe, leases
from webhooks.caps.leases import CappedBuyer
from webhooks.caps.sales import ledger_total, queued_sales, settled_of, total, with_queued_sales
from webhooks.storage.live import keys, settle_queue
from webhooks.storage.live.batch import Client
from webhooks.storage.live.redis import Store
from webhooks.storage.live.scripts import LedgerBalance
from webhooks.storage.records.db import db

log = logging.getLogger(__name__)

LOCK_TTL_MS = 60_000
# After the last delivery deadline: time for every web process to see the loss (its journal
# looks every 0.5 s) and push its journal again (it first asks the ledger, for 2 s at most,
# which entries it holds already; settlement.py LEDGER_CHECK_S).
SETTLE_MARGIN_S = 4.0


def request(store: Store, queue_redis: Client, buyer: CappedBuyer, buyer_timeout_ms: int) -> bool:
    """Start a rebuild of `buyer` in the background unless one is running; True if started."""
    token = uuid.uuid4().hex
    if not store.redis.set(keys.rebuild_lock(buyer.id), token, nx=True, px=LOCK_TTL_MS):
        return False
    billing = buyer.billing
    known = billing is None or store.redis.hexists(store.balance_key(buyer.id, billing.key), "wallet")
    if store.redis.exists(keys.ready(buyer.id)) and known:
        # The `not_ready` that sent us here was read before a rebuild that has finished
        # since (a busy process reads its answers late): not another one. (A billed buyer's
        # balance unknown with its counters trusted is rebuilt too: the counters only rise.)
        store.release_claim(keys.rebuild_lock(buyer.id), token)
        return False
    log.warning("counters of buyer %s are not trusted (Redis lost data?): rebuilding", buyer.id)
    delay = buyer_timeout_ms / 1000 + SETTLE_MARGIN_S
    threading.Thread(target=_run, args=(store, queue_redis, buyer, token, delay), daemon=True).start()
    return True


def _run(store: Store, queue_redis: Client, buyer: CappedBuyer, token: str, delay: float) -> None:
    time.sleep(delay)
    try:
        rebuild(store, queue_redis, buyer, token)
    except Exception:
        # The lock expires and the next lead for this buyer starts another try.
        log.exception("rebuild of buyer %s failed", buyer.id)


def sold_counts(
    queue_redis: Client, buyer: CappedBuyer, now: datetime, pending: list[dict[str, Any]] | None = None
) -> dict[str, int]:
    """Sold leads (and cents for daily_budget) of each current window: the ledger's, counted
    by the database, plus the unsettled sales it does not have yet. The queue is read first
    and the ledger after it (which queued sales it has, then the totals): a sale settled
    in between is counted twice at worst (the safe way: a slot less), never missed."""
    windows = leases.windows(buyer, now)
    if not windows:
        return {}
    queued = queued_sales(queue_redis, buyer.id, min(w.start for _, _, w in windows), pending)
    with db.connection_context():
        for key in settled_of(list(queued), buyer.id):
            del queued[key]
        settled = {cap: ledger_total(buyer.id, cap, w) for cap, _, w in windows}
    return {cap: settled[cap] + total(queued.values(), cap, w) for cap, _, w in windows}


def rebuild(store: Store, queue_redis: Client, buyer: CappedBuyer, token: str, now: datetime | None = None) -> bool:
    now = now or datetime.now(timezone.utc)
    # The consumers bought within the dedupe window first: `ready` (set below) must not come
    # before them, or a duplicate could be sold in between.
    # The settlement queue is read and decoded once for both (after a data loss it holds
    # every journal pushed again: the costly part of a rebuild).
    pending = settle_queue.unsettled(queue_redis, mentioning=buyer.id)
    restored = dedupe.restore(
        store, queue_redis, buyer.id, fields=buyer.dedupe_fields, days=buyer.dedupe_days, now=now, pending=pending
    )
    counts = sold_counts(queue_redis, buyer, now, pending)
    done = store.rebuild_counters(
        buyer.id,
        token,
        [
            (leases.counter_key(buyer.id, w), counts[cap], leases.expire_at(w))
            for cap, _, w in leases.windows(buyer, now)
        ],
        None if buyer.billing is None else _wallet(queue_redis, buyer.billing),
    )
    if done:
        log.warning(
            "buyer %s counters rebuilt from the ledger: %s; %d consumer(s) remembered again", buyer.id, counts, restored
        )
    return done


def _wallet(queue_redis: Client, billing: Billing) -> LedgerBalance:
    """The buyer's wallet in the ledger, with the queued sales of every buyer of it."""
    return with_queued_sales(billing, settle_queue.unsettled(queue_redis, mentioning=billing.key))[0]
