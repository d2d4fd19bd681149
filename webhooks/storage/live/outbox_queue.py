"""The Redis side of the events outbox: a committed change wakes the worker, and one drain job
at a time fans out and sends (as the settlement queue does for leads: one job, many events).

The events themselves live in the database (events, event_dispatches), written in the
transaction of the change. Everything here may be lost with Redis: the scheduled sweep (workers/outbox.py)
starts a drain again from what the database holds, so sending depends only on the database.
"""

from __future__ import annotations

import logging
from typing import Any

from rq import Queue

from webhooks.storage.live import keys
from webhooks.storage.live.batch import Client
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.live.settle_queue import RETRY

log = logging.getLogger(__name__)

EVENTS = "floodgate-events"  # the queue the `events` process listens on: never the settlements'
JOB_TIMEOUT = 180  # a drain hands over to a fresh job well before this (workers/outbox.py)
SCHEDULED_TTL_MS = 60_000  # a drain is scheduled or running while keys.OUTBOX_SCHEDULED lives


def enqueue_drain(q: Queue, **meta: Any) -> None:
    """Ask the events worker to fan out and send the pending events. `q` is any queue on RQ's
    Redis: the job goes to EVENTS, so a receiver that stalls a drain never holds up the
    settlement worker."""
    events = q if q.name == EVENTS else Queue(EVENTS, connection=q.connection)
    events.enqueue("workers.outbox.drain", job_timeout=JOB_TIMEOUT, retry=RETRY, meta=meta, description="send events")


def signal(queue_redis: Client, q: Queue, request_id: str | None = None) -> None:
    """After a commit that made an event: wake a drain that is waiting for work, and start one
    unless one is scheduled already. One round trip (plus the enqueue when one is needed)."""
    pipe = queue_redis.pipeline(transaction=False)
    pipe.lpush(keys.OUTBOX_WAKE, "1")
    pipe.ltrim(keys.OUTBOX_WAKE, 0, 0)  # one wake-up is as good as many
    pipe.set(keys.OUTBOX_SCHEDULED, "1", nx=True, px=SCHEDULED_TTL_MS)
    if pipe.execute()[-1]:
        enqueue_drain(q, request_id=request_id)


def wake(queue_redis: Client, q: Queue, request_id: str | None = None) -> None:
    """`signal`, for callers whose commit stands whatever Redis does: if Redis is down the event
    still is in the database, and the scheduled sweep starts its sending."""
    try:
        signal(queue_redis, q, request_id)
    except REDIS_DOWN as exc:
        log.warning("event committed, worker not woken (the sweep will send it): %s", exc)


def ensure_drain(queue_redis: Client, q: Queue) -> bool:
    """Start a drain unless one is scheduled or running (the sweep); True when one was enqueued."""
    if queue_redis.set(keys.OUTBOX_SCHEDULED, "1", nx=True, px=SCHEDULED_TTL_MS):
        enqueue_drain(q, reason="sweep")
        return True
    return False


def still_draining(queue_redis: Client) -> None:
    """A running drain keeps the flag alive, so that commits wake it instead of enqueueing more."""
    queue_redis.set(keys.OUTBOX_SCHEDULED, "1", px=SCHEDULED_TTL_MS)


def wait_for_work(queue_redis: Client, timeout_s: float) -> bool:
    """Block until a commit signals new events, at most `timeout_s`; True when one did."""
    return queue_redis.blpop([keys.OUTBOX_WAKE], timeout=max(0.01, timeout_s)) is not None


def stop_draining(queue_redis: Client) -> None:
    """Clear the flag before a drain's last look at the database: a commit after that look
    finds the flag gone and starts a new drain."""
    queue_redis.delete(keys.OUTBOX_SCHEDULED)
