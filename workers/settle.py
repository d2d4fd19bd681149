"""Settlement: drain the pending list into the ledger in batches (one job, many leads)."""

from __future__ import annotations

import logging
import signal
import time
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any

import peewee as pw
from rq import get_current_job

from webhooks.billing import balance, balance_events
from webhooks.billing.charges import Charged
from webhooks.caps import leases
from webhooks.leads.accounting import ledger
from webhooks.leads.accounting.item import SettlementItem, skipped_for_balance
from webhooks.leads.rules import earnings
from webhooks.payments import gate
from webhooks.storage.live import keys, outbox_queue
from webhooks.storage.live.batch import Client
from webhooks.storage.live.redis import REDIS_DOWN, Store
from webhooks.storage.live.scripts import Backlog
from webhooks.storage.live.settle_queue import SCHEDULED_TTL_MS, enqueue_drain, queue
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, close_db, db
from webhooks.storage.records.models import utcnow
from workers.context import backends

log = logging.getLogger(__name__)

BATCH = 200
WEBHOOK_CALL_BATCH = 50  # audit rows keep bodies of up to 64 KiB: at most ~4.4 MB a statement
TIME_BUDGET_S = 30.0
LINGER_S = 1.0
GATHER_S = 0.1


class StopAfterBatch:
    """SIGTERM (a deploy) while a drain runs: finish the batch in hand, then hand the rest to a
    fresh job and return, so the worker stops within one batch instead of the whole time
    budget. RQ's own handler still runs (it ends the worker once the job returns)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None

    def __enter__(self) -> StopAfterBatch:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._on_term)
        except ValueError:  # not the main thread (a drain run inline): no signal to take
            self._previous = None
        return self

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        log.info("stop requested: finishing the batch in hand")
        if callable(self._previous):
            self._previous(signum, frame)

    def __exit__(self, *_exc: object) -> None:
        # RQ's handler replaces itself with its force-stop handler: leave that one in place.
        if self._previous is not None and signal.getsignal(signal.SIGTERM) == self._on_term:
            signal.signal(signal.SIGTERM, self._previous)


def drain(batch_size: int = BATCH, time_budget_s: float = TIME_BUDGET_S) -> int:
    """Write pending settlements, and the queued audit rows of webhook calls that changed
    nothing (payments/gate.py), until none are left; return how many leads were new.

    A job killed mid-batch is run again by RQ under the same id and takes back the batches
    it held (see lua/take_batch.lua); the ledger's unique keys make a settlement's rewrite
    harmless (an audit row's rewrite repeats the row). A job asked to stop (SIGTERM)
    finishes its batch and hands the rest to a new job."""
    b = backends()
    r = b.queue_redis.redis
    job = get_current_job()
    job_id = job.id if job else "inline-" + uuid.uuid4().hex
    processing = keys.settle_processing(job_id)
    log.info("draining settlements", extra={"job_id": job_id})
    written, started = 0, time.monotonic()
    try:
        with StopAfterBatch() as stop:
            while True:
                recorded = write_webhook_calls(b.queue_redis, job_id)
                batch = b.queue_redis.take_batch(Backlog.SETTLEMENTS, job_id, batch_size)
                if not batch and not recorded:
                    # Wait a moment for more (blocking in Redis), so that one job serves a
                    # steady stream of leads instead of one job being enqueued every few leads.
                    if (
                        not stop.requested
                        and r.blmove(
                            keys.SETTLE_PENDING,
                            processing,
                            LINGER_S,  # type: ignore[arg-type]
                            "RIGHT",
                            "LEFT",
                        )
                        is not None
                    ):  # (a float timeout is fine)
                        continue
                    # Clear the flag, then look once more: an item pushed in between either
                    # sees the flag gone (and enqueues a job) or is picked up here.
                    r.delete(keys.SETTLE_SCHEDULED)
                    if (r.llen(keys.SETTLE_PENDING) or r.llen(keys.WEBHOOK_CALLS_PENDING)) and r.set(
                        keys.SETTLE_SCHEDULED, "1", nx=True, px=SCHEDULED_TTL_MS
                    ):
                        if not stop.requested:
                            continue
                        enqueue_drain(queue(job.connection) if job else queue(r))  # hand over
                    return written
                r.set(keys.SETTLE_SCHEDULED, "1", px=SCHEDULED_TTL_MS)  # still draining
                if batch:
                    items = [SettlementItem.from_json(x) for x in batch]
                    written += _settle(b.store, r, items, lookup_key=b.cfg.suppression_key.encode())
                    r.delete(processing)
                if stop.requested or time.monotonic() - started > time_budget_s:
                    # Hand over to a fresh job (the flag stays set): no job runs for ever, and
                    # a worker told to stop leaves within one batch.
                    enqueue_drain(queue(job.connection) if job else queue(r))
                    return written
                if len(batch) < batch_size and recorded < WEBHOOK_CALL_BATCH:
                    # A small batch means the queue is keeping up: let a few more leads
                    # gather before the next transaction (settlement is asynchronous anyway).
                    time.sleep(GATHER_S)
    finally:
        close_db()


def _settle(store: Store, r: Client, items: list[SettlementItem], *, lookup_key: bytes) -> int:
    """One batch into the ledger, then what follows its commit in Redis: the events drain
    woken for lead.sold, billed buyers' balances synced, the sales' leases released; then
    the billed buyers' balance events, from what the sync left (docs/buyers.md "Balances")."""
    new = ledger.settle_new(items, lookup_key=lookup_key)
    written = len(new)
    # what epl routing ranks by: each new lead's offers, yeses and sales (a lead settled before
    # was counted then); lost with Redis, rebuilt from the ledger (leads/rules/earnings.py)
    counted = [
        earnings.settled(
            i.publisher_id,
            i.received_at,
            i.attempts,
            [(s.buyer_id, s.price, s.sold_at or i.received_at) for s in i.sales()],
        )
        for i in new
    ]
    earnings.count(store.redis, [c for changes in counted for c in changes])
    if any(i.sold for i in items):
        outbox_queue.wake(r, queue(r))  # their lead.sold events
    sales = [s for i in items for s in i.sales()]  # a shared lead's several
    billed = [(s.lease[0], s.lease[1], Charged(*s.charge)) for s in sales if s.lease and s.charge]
    # before the leases go: they say what each sale held
    synced = balance.sync_settled(store, billed) if billed else {}
    leases.release_settled(store.redis, [s.lease for s in sales if s.lease])
    if balance_events.write(store, skipped_for_balance(items), synced, utcnow()):
        outbox_queue.wake(r, queue(r))
    return written


def sweep() -> int:
    """The scheduler's safety net (workers/schedule.py): `drain`, ending quietly through a
    database or Redis outage instead of failing. A failed periodic job would stay in RQ's
    failed registry (an operator's alarm) for an outage the system rides out: rq-scheduler
    runs this job again, under the same id, within a minute, and that run takes back the
    batches held now (lua/take_batch.lua). Drains enqueued on a push keep failing for RQ to
    retry them under their own id, the one that takes their held batch back (a drain that
    ended quietly would leave it held for ever); the worker outlives a failure RQ cannot
    record (workers/worker.py)."""
    try:
        return drain()
    except UNAVAILABLE_ERRORS as exc:
        log.warning("database unavailable (%s): the safety-net drain runs again within a minute", exc)
        return 0
    except REDIS_DOWN as exc:
        log.warning("Redis unavailable (%s): the safety-net drain runs again within a minute", exc)
        return 0


def write_webhook_calls(queue_redis: Store, job_id: str, batch_size: int = WEBHOOK_CALL_BATCH) -> int:
    """Write one batch of queued webhook-call audit rows; return how many were taken. A row the
    database refuses (not an outage, which fails the job for RQ to retry) is parked in
    keys.WEBHOOK_CALLS_FAILED with a log line, so that it cannot stop lead settlement."""
    processing = keys.webhook_calls_processing(job_id)
    batch = queue_redis.take_batch(Backlog.PAYMENT_AUDIT, job_id, batch_size)
    if not batch:
        return 0
    try:
        with db.atomic():
            gate.write_rows(batch)
    except UNAVAILABLE_ERRORS:
        raise
    except (pw.DatabaseError, ValueError, KeyError) as exc:
        log.warning("a batch of %d webhook-call audit rows was refused (%s): writing them one by one", len(batch), exc)
        for raw in batch:
            try:
                with db.atomic():
                    gate.write_rows([raw])
            except UNAVAILABLE_ERRORS:
                raise
            except (pw.DatabaseError, ValueError, KeyError) as one:
                log.error(
                    "webhook-call audit row refused by the database, parked in %s: %s (%s)",
                    keys.WEBHOOK_CALLS_FAILED,
                    raw[:300],
                    one,
                )
                queue_redis.redis.lpush(keys.WEBHOOK_CALLS_FAILED, raw)
    queue_redis.redis.delete(processing)
    return len(batch)
