"""Delivery of payment events (webhooks/payments/outbox.py): one drain job delivers many events
(the worker is non-forking, as for settlements), and a periodic sweep starts a drain again from
the database when the job that should deliver them was lost (Redis restarted empty, a worker
killed), so that delivery depends only on the database."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from rq import Queue, get_current_job

from webhooks import metrics
from webhooks.payments import outbox
from webhooks.storage import claims, keys, outbox_queue
from webhooks.storage.batch import Client
from webhooks.storage.db import close_db
from webhooks.storage.models import utcnow
from webhooks.storage.redis import REDIS_DOWN, make_queue_redis
from webhooks.storage.settle_queue import queue
from workers.context import Backends, backends
from workers.settle import StopAfterBatch

log = logging.getLogger(__name__)

TIME_BUDGET_S = 30.0  # then a fresh job takes over, so settlement jobs get their turn
LINGER_S = 1.0  # wait this long for new events (or a retry that is due) before leaving
LOCK_WAIT_S = 5.0  # a drain started while another is finishing waits for its lock this long
THREADS = 16  # customers served at once


def _queue(b: Backends) -> Queue:
    job = get_current_job()
    return queue(job.connection) if job else queue(make_queue_redis(b.cfg.queue_redis_url))


def _lock_ttl_ms(timeout_ms: int) -> int:
    """Outlives the longest batch: its budget, then a last delivery's connect and read timeouts."""
    return int((outbox.BATCH_BUDGET_S + 5.0 + timeout_ms / 1000 + 10.0) * 1000)


def _acquire(b: Backends, ttl_ms: int) -> claims.Claim | None:
    """Only the holder of keys.OUTBOX_LOCK delivers, so a customer's events leave one at a time."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        lock, _holder = claims.claim(b.settle, keys.OUTBOX_LOCK, ttl_ms)
        if lock is not None or time.monotonic() > deadline:
            return lock
        time.sleep(0.05)


def _keep(r: Client, lock: claims.Claim, ttl_ms: int) -> bool:
    """Extend our lock; False when it is no longer ours (it expired while a batch stalled and
    another drain took it: this one stops; at worst an event in that batch went out twice)."""
    if r.get(lock.key) != lock.token:
        return False
    r.pexpire(lock.key, ttl_ms)
    return True


def drain(time_budget_s: float = TIME_BUDGET_S) -> int:
    """Deliver due payment events until none is due within LINGER_S; return how many were
    delivered. A job asked to stop (SIGTERM), or past its time budget, hands over to a new one."""
    b = backends()
    cfg = b.cfg
    if not cfg.payment_events_url:
        log.warning("PAYMENT_EVENTS_URL is not set for this worker: payment events stay pending")
        return 0
    r = b.settle.redis
    ttl_ms = _lock_ttl_ms(cfg.payment_events_timeout_ms)
    lock = _acquire(b, ttl_ms)
    if lock is None:
        log.info("another drain is delivering payment events")
        return 0
    sender = outbox.Sender(cfg.payment_events_url, cfg.payment_events_secrets, cfg.payment_events_timeout_ms / 1000)
    policy = outbox.RetryPolicy(
        cfg.payment_events_retry_base_ms, cfg.payment_events_retry_max_ms, cfg.payment_events_retry_for_s
    )
    delivered, started = 0, time.monotonic()
    try:
        with ThreadPoolExecutor(THREADS, thread_name_prefix="events") as pool, StopAfterBatch() as stop:
            while True:
                if not _keep(r, lock, ttl_ms):
                    log.warning("payment events lock lost; another drain carries on")
                    return delivered
                outbox_queue.still_draining(r)
                batch = outbox.deliver_due(sender, policy, pool)
                delivered += len(batch.delivered)
                metrics.payment_events(
                    [(e.delivered_at - e.created_at).total_seconds() for e in batch.delivered],
                    batch.failed_attempts,
                    batch.gave_up,
                )
                if stop.requested or time.monotonic() - started > time_budget_s:
                    outbox_queue.enqueue_drain(_queue(b), reason="handover")  # the flag stays set
                    return delivered
                if batch.attempted:
                    continue
                if batch.next_due_s is not None and batch.next_due_s <= LINGER_S:
                    outbox_queue.wait_for_work(r, batch.next_due_s)  # a retry due soon, or new events
                    continue
                if outbox_queue.wait_for_work(r, LINGER_S):
                    continue
                # Clear the flag, then look once more: an event committed in between either
                # finds the flag gone (and starts a drain) or is seen here.
                outbox_queue.stop_draining(r)
                if outbox.next_due_s(utcnow()) == 0:
                    continue
                return delivered
    finally:
        try:
            claims.release(b.settle, lock)
        except REDIS_DOWN as exc:
            log.warning("payment events lock not released (expires by ttl): %s", exc)
        close_db()


def sweep() -> bool:
    """The safety net (every few seconds, workers/schedule.py): when an event is due and no drain
    is scheduled or running, enqueue one. True when it did."""
    b = backends()
    try:
        if not b.cfg.payment_events_url or outbox.next_due_s(utcnow()) != 0:
            return False
        started = outbox_queue.ensure_drain(b.settle.redis, _queue(b))
        if started:
            log.info("payment events due and no drain running: one enqueued")
        return started
    finally:
        close_db()
