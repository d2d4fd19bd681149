"""Reconciliation: make each Redis cap counter of the current windows equal what is sold
(ledger + queued settlements) plus what is reserved by live leases.

A counter is read together with every live lease at one instant (lua/snapshot_caps.lua);
a sale counts unless its lease is in that snapshot (then the lease counts) or was reserved
after it. The correction is applied as a delta, so reservations made while the ledger was
being read are kept: reconciliation can neither open room past a cap nor hide a sale.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, cast

from webhooks import metrics
from webhooks.billing import balance
from webhooks.caps import dedupe, leases
from webhooks.caps.leases import CappedBuyer
from webhooks.caps.sales import sales_since, total, with_queued_sales
from webhooks.caps.windows import Window
from webhooks.storage.live import keys, settle_queue
from webhooks.storage.live.batch import Client
from webhooks.storage.live.redis import Store
from webhooks.storage.live.scripts import BalanceReconciled, CapSnapshot, WalletLeases
from webhooks.storage.records import audit
from webhooks.storage.records.db import db
from webhooks.storage.states import SnapshotStatus

log = logging.getLogger(__name__)
SNAPSHOT_TRIES = 5
RECONCILE_LOCK_MS = 60_000


@dataclass(frozen=True, kw_only=True)
class Finding:
    buyer_id: str
    cap: str
    window: str
    counter: int  # what Redis held
    expected: int  # sold + in flight
    corrected_to: int | None  # None when there was nothing to correct


def reconcile_buyer(
    store: Store, queue_redis: Client, buyer: CappedBuyer, now: datetime | None = None
) -> list[Finding]:
    now = now or datetime.now(timezone.utc)
    if buyer.dedupe_fields and store.redis.exists(keys.ready(buyer.id)):
        missing = dedupe.restore(
            store, queue_redis, buyer.id, fields=buyer.dedupe_fields, days=buyer.dedupe_days, now=now
        )
        if missing:
            log.warning(
                "buyer %s: %d consumer(s) sold within the dedupe window were not remembered; restored from the ledger",
                buyer.id,
                missing,
            )
    windows = leases.windows(buyer, now)
    if not windows:
        return []
    # A lead returned from now on leaves its slot to this run (lua/give_back.lua), which reads
    # the ledger after the counters: the return is then counted once, here or there.
    lock = keys.reconciling(buyer.id)
    if not store.redis.set(lock, "1", nx=True, px=RECONCILE_LOCK_MS):
        log.info("buyer %s is being reconciled by another run", buyer.id)
        return []
    try:
        return _reconcile_windows(store, queue_redis, buyer, windows)
    finally:
        store.redis.delete(lock)


def _reconcile_windows(
    store: Store, queue_redis: Client, buyer: CappedBuyer, windows: list[tuple[str, int, Window]]
) -> list[Finding]:
    counters = [leases.counter_key(buyer.id, w) for _, _, w in windows]
    snap = _snapshot(store, buyer.id, counters)
    if snap.status is SnapshotStatus.NOT_READY:
        return []  # Redis lost data: the rebuild, not reconciliation, restores this buyer
    if snap.status is SnapshotStatus.CHANGED:
        log.warning("leases of buyer %s kept changing: not reconciled this time", buyer.id)
        return []
    values = snap.counters
    in_flight = [sum(amounts[i] for amounts in snap.leases.values()) for i in range(len(counters))]
    since = min(w.start for _, _, w in windows)
    sold = [
        s
        for s in sales_since(queue_redis, buyer.id, since).values()
        if s.lease_id not in snap.leases and (s.reserved_us is None or s.reserved_us < snap.at_us)
    ]
    findings = []
    for i, (cap, _, w) in enumerate(windows):
        expected = total(sold, cap, w) + in_flight[i]
        metrics.drift(buyer.id, cap, expected - values[i])
        corrected = None
        if values[i] != expected:
            corrected = store.adjust_counter(counters[i], expected - values[i], leases.expire_at(w))
        findings.append(
            Finding(
                buyer_id=buyer.id, cap=cap, window=w.label, counter=values[i], expected=expected, corrected_to=corrected
            )
        )
    return findings


def _snapshot(store: Store, buyer_id: str, counters: list[str]) -> CapSnapshot:
    """lua/snapshot_caps.lua over the leases the zset holds now; read again (a few times at
    most) when a lease came or went between the two calls."""
    for _ in range(SNAPSHOT_TRIES):
        lease_ids = cast("list[str]", store.redis.zrange(keys.leases(buyer_id), 0, -1))  # decoded replies
        snap = store.snapshot_caps(buyer_id, counters, lease_ids)
        if snap.status is not SnapshotStatus.CHANGED:
            break
    return snap


def reconcile_balance(store: Store, queue_redis: Client, buyer: CappedBuyer) -> BalanceReconciled | None:
    """The balance a billed buyer draws on made equal to the ledger (lua/reconcile_balance.lua):
    the wallet's figure, and held = what the live leases of every buyer of the wallet hold + the
    prices of their queued sales whose lease is gone. The queue is read first and the ledger
    after it: a sale settled in between is held and debited both at worst (the safe way), never
    neither. None when the buyer is not billed."""
    billing = buyer.billing
    if billing is None:
        return None
    key = store.balance_key(buyer.id, billing.key)
    # every buyer ever billed from the wallet, deleted or not: a lease of any may hold on it
    buyer_ids = sorted({buyer.id, *balance.wallet_buyers(billing.key)}) if store.shared_wallets else [buyer.id]
    pending = settle_queue.unsettled(queue_redis, mentioning=billing.key)
    wallet, charges = with_queued_sales(billing, pending)
    queued = tuple((b, lease_id, minor) for b, lease_id, minor in charges if lease_id is not None and b in buyer_ids)
    found = BalanceReconciled("changed")
    for _ in range(5):  # the leases change under busy buyers: read them again
        pipe = store.redis.pipeline(transaction=False)
        for b in buyer_ids:
            pipe.zrange(keys.leases(b), 0, -1)
        zsets = pipe.execute()
        held = tuple((b, tuple(str(i) for i in ids)) for b, ids in zip(buyer_ids, zsets))
        found = store.reconcile_balance(WalletLeases(balance_key=key, wallet=wallet, buyers=held, queued=queued))
        if found.status != "changed":
            break
    if found.status == "ok" and found.held_before != found.held_now:
        log.warning(
            "balance of wallet %s drift: held %d, leases and queued sales of buyers %s hold %d; corrected",
            billing.key,
            found.held_before,
            ", ".join(buyer_ids),
            found.held_now,
        )
    return found


def reconcile_all(store: Store, queue_redis: Client, buyers: Iterable[CappedBuyer]) -> list[dict[str, Any]]:
    """Reconcile each of `buyers` (the active ones), their caps and a billed one's balance; log
    and audit each drift; return the drifts found."""
    drifts: list[dict[str, Any]] = []
    reconciled: set[str] = set()  # balances: one per wallet on one Redis, whichever buyer comes first
    for buyer in buyers:
        billing = buyer.billing
        key = None if billing is None else store.balance_key(buyer.id, billing.key)
        held = None if key is None or key in reconciled else reconcile_balance(store, queue_redis, buyer)
        if key is not None:
            reconciled.add(key)
        if held is not None and held.status == "ok" and held.held_before != held.held_now:
            drifts.append({"buyer_id": buyer.id, "cap": "balance", "held": held.held_before, "expected": held.held_now})
        for f in reconcile_buyer(store, queue_redis, buyer):
            if f.corrected_to is not None:
                drifts.append(asdict(f))
                log.warning(
                    "cap drift %s %s %s: counter %d, sold+in flight %d, corrected",
                    f.buyer_id,
                    f.cap,
                    f.window,
                    f.counter,
                    f.expected,
                )
    with db.connection_context(), db.atomic():
        for d in drifts:
            audit.record("reconcile", "cap.drift", "buyer", d["buyer_id"], d)
    metrics.reconciled()
    log.info("reconciliation done: %d drift(s) corrected", len(drifts))
    return drifts
