"""Events sent to every endpoint (webhooks/events/sender.py): one drain job fans out and
sends many events (the worker is non-forking, as for settlements), and a periodic sweep starts
a drain again from the database when the job that should send them was lost (Redis restarted
empty, a worker killed), so that sending depends only on the database. The fan-out
happens here, never in the web process: one event row per change there, whatever the number
of endpoints."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rq import Queue, get_current_job

from webhooks import metrics
from webhooks.events import endpoints, sender
from webhooks.storage.live import claims, keys, outbox_queue
from webhooks.storage.live.batch import Client
from webhooks.storage.live.redis import REDIS_DOWN, make_queue_redis
from webhooks.storage.live.settle_queue import queue
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, close_db
from webhooks.storage.records.models import utcnow
from workers.context import Backends, backends
from workers.settle import StopAfterBatch

log = logging.getLogger(__name__)

TIME_BUDGET_S = 30.0  # then a fresh job takes over, so settlement jobs get their turn
LINGER_S = 1.0  # wait this long for new events (or a retry that is due) before leaving
LOCK_WAIT_S = 5.0  # a drain started while another is finishing waits for its lock this long
THREADS = 32  # chains (one queue of one endpoint each) in flight at once


def _queue(b: Backends) -> Queue:
    job = get_current_job()
    return queue(job.connection) if job else queue(make_queue_redis(b.cfg.queue_redis_url))


LOCK_TTL_MS = 30_000  # extended at every step (a step waits at most LINGER_S)


def _acquire(b: Backends, ttl_ms: int) -> claims.Claim | None:
    """Only the holder of keys.OUTBOX_LOCK sends, so each queue's events leave one at a time."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        lock, _holder = claims.claim(b.queue_redis, keys.OUTBOX_LOCK, ttl_ms)
        if lock is not None or time.monotonic() > deadline:
            return lock
        time.sleep(0.05)


def _keep(r: Client, lock: claims.Claim, ttl_ms: int) -> bool:
    """Extend our lock; False when it is no longer ours (it expired while a batch stalled and
    another drain took it: this one stops; at worst an event in that batch went out twice), or
    when Redis does not answer (this drain stops; the sweep starts another once it is back)."""
    try:
        if r.get(lock.key) != lock.token:
            return False
        r.pexpire(lock.key, ttl_ms)
    except REDIS_DOWN:
        return False
    return True


def _engine(b: Backends, pool: ThreadPoolExecutor) -> sender.Engine:
    cfg = b.cfg
    policy = sender.RetryPolicy(
        cfg.payment_events_retry_base_ms, cfg.payment_events_retry_max_ms, cfg.payment_events_retry_for_s
    )
    return sender.Engine(
        pool,
        policy,
        cfg.event_delivery_timeout_ms / 1000,
        cfg.event_endpoint_disable_after_s,
        managed_secrets=cfg.payment_events_secrets,
    )


def _count(written: sender.Written) -> int:
    metrics.events_delivered(
        [(d.dispatch.endpoint_id, lag) for d, lag in zip(written.delivered, written.lags_s, strict=True)],
        written.failed,
        written.gave_up,
        written.disabled,
    )
    return len(written.delivered)


def drain(time_budget_s: float = TIME_BUDGET_S) -> int:
    """Fan out and send events until nothing is due within LINGER_S; return how many were
    delivered. A job asked to stop (SIGTERM), or past its time budget, finishes the chains it
    has in flight and hands over to a new one. Redis or the database going away ends it
    quietly: an exception escaping a job while Redis is down would end the worker, and the
    events wait in the database for the sweep's next drain."""
    try:
        return _drain(time_budget_s)
    except (*REDIS_DOWN, *UNAVAILABLE_ERRORS) as exc:
        log.warning("events drain stopped, its work left for the next one: %s", exc)
        return 0


def _drain(time_budget_s: float) -> int:
    b = backends()
    r = b.queue_redis.redis
    ttl_ms = LOCK_TTL_MS
    lock = _acquire(b, ttl_ms)
    if lock is None:
        log.info("another drain is sending events")
        return 0
    deadline = time.monotonic() + time_budget_s
    try:
        endpoints.sync_managed(b.cfg.payment_events_url, b.cfg.payment_events_secrets)
        with ThreadPoolExecutor(THREADS, thread_name_prefix="events") as pool, StopAfterBatch() as stop:
            engine = _engine(b, pool)

            def keep() -> bool:
                return _keep(r, lock, ttl_ms)

            try:
                return _rounds(b, engine, keep, stop, deadline)
            finally:
                # Sends in flight end within their deadline; what they did is written if the
                # database answers (else they stay pending and go again, same webhook-id).
                _count(engine.finish(keep))
    finally:
        try:
            claims.release(b.queue_redis, lock)
        except REDIS_DOWN as exc:
            log.warning("events lock not released (expires by ttl): %s", exc)
        close_db()


def _rounds(b: Backends, engine: sender.Engine, keep: Callable[[], bool], stop: StopAfterBatch, deadline: float) -> int:
    """Fan out, send and collect, round after round, while the lock is ours; return how many
    were delivered once nothing is due within LINGER_S, or hand over past `deadline` or when
    asked to stop."""
    r = b.queue_redis.redis
    delivered = 0
    while True:
        if not keep():
            log.warning("events lock lost (or Redis away); another drain carries on")
            return delivered
        outbox_queue.still_draining(r)
        engine.refresh()
        fanned = sender.fan_out(engine.endpoints, utcnow())
        submitted = engine.submit_due()
        delivered += _count(engine.collect(0.05 if (fanned or submitted) else 0.5))
        if stop.requested or time.monotonic() > deadline:
            delivered += _count(engine.finish(keep))
            outbox_queue.enqueue_drain(_queue(b), reason="handover")  # the flag stays set
            return delivered
        if fanned or submitted or engine.in_flight or _work_soon(r, engine):
            continue
        return delivered


def _work_soon(r: Client, engine: sender.Engine) -> bool:
    """Nothing to do right now: wait for a retry due within LINGER_S or a wake, and say whether
    there is work again; False when the drain may end."""
    due = sender.next_due_s(engine.enabled(), utcnow())
    if due is not None and due <= LINGER_S:
        if outbox_queue.wait_for_work(r, max(due, 0.05)):  # a retry due soon, or a wake
            engine.refresh(force=True)  # a wake may be an endpoint enabled
        return True
    if outbox_queue.wait_for_work(r, LINGER_S):
        engine.refresh(force=True)
        return True
    # Clear the flag, then look once more: an event committed in between either
    # finds the flag gone (and starts a drain) or is seen here.
    outbox_queue.stop_draining(r)
    engine.refresh(force=True)
    return sender.work_waiting(engine.enabled(), utcnow())


def sweep() -> bool:
    """The safety net (every few seconds, workers/schedule.py): when an event waits for fan-out
    or a dispatch is due and no drain is scheduled or running, enqueue one. True when it did;
    False too when Redis or the database does not answer (the next sweep looks again)."""
    b = backends()
    try:
        enabled = [ep.id for ep in endpoints.active(b.cfg.payment_events_secrets) if ep.sendable]
        if not enabled and b.cfg.payment_events_url:
            enabled = [endpoints.MANAGED_ID]  # not made yet: the first drain makes it
        if not sender.work_waiting(enabled, utcnow()):
            return False
        started = outbox_queue.ensure_drain(b.queue_redis.redis, _queue(b))
        if started:
            log.info("events waiting and no drain running: one enqueued")
        return started
    except (*REDIS_DOWN, *UNAVAILABLE_ERRORS) as exc:
        log.warning("events sweep skipped (the next one looks again): %s", exc)
        return False
    finally:
        close_db()
