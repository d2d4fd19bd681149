"""The settlement queue: routed leads wait in one Redis list (keys.SETTLE_PENDING) that a
single RQ job drains in batches (workers/settle.py), so intake at hundreds of leads a second
costs one LPUSH each, not one forked job each. Also the RQ queue and how a drain is enqueued
(with retries on database errors)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, cast

import redis
from rq import Queue, Retry

from webhooks.storage.live import keys
from webhooks.storage.live.batch import Batch, Client

SETTLE = "floodgate"  # the one queue the `worker` process listens on
# The first retry is immediate (a blip, or a job abandoned by a killed worker), then back-off.
RETRY = Retry(max=9, interval=[0, 1, 2, 5, 10, 30, 60, 120, 300])
JOB_TIMEOUT = 120
SCHEDULED_TTL_MS = 60_000  # a drain job is scheduled or running while keys.SETTLE_SCHEDULED lives


def queue(connection: Client, name: str = SETTLE) -> Queue:
    # RQ runs on one Redis (RQ_REDIS_URL names no cluster), the settle store's client included
    return Queue(name, connection=cast(redis.Redis, connection))


def enqueue_drain(q: Queue, **meta: Any) -> None:
    """Ask a worker to drain the pending settlements."""
    q.enqueue(
        "workers.settle.drain", job_timeout=JOB_TIMEOUT, retry=RETRY, meta=meta, description="drain pending settlements"
    )


def push(
    queue_redis: Client,
    queue: Queue,
    raws: list[str],
    batch: Batch | None = None,
    *,
    request_id: str | None = None,
    key: str = keys.SETTLE_PENDING,
) -> None:
    """Queue serialised settlements (or, with `key` keys.WEBHOOK_CALLS_PENDING, audit rows of
    payment webhook calls); start a drain job unless one is already scheduled. `batch` (on
    `queue_redis`) lets the caller send its own commands in the same round trip; it is sent here."""
    b = Batch(queue_redis) if batch is None else batch
    b.lpush(key, *raws)
    scheduled = b.set(keys.SETTLE_SCHEDULED, "1", nx=True, px=SCHEDULED_TTL_MS)
    b.execute()
    if scheduled.value:
        enqueue_drain(queue, request_id=request_id)


def unsettled(queue_redis: Client, mentioning: str | None = None) -> list[dict[str, Any]]:
    """Every settlement not yet in the ledger: pending, or taken by a job not yet done. With
    `mentioning` (an id), only those whose JSON holds it as a string somewhere: a superset of
    the ones sold to that buyer, decoded without decoding the rest. After a Redis data loss
    the queue holds every journal pushed again (tens of thousands), and a counter rebuild
    per buyer decoding all of them held its web worker's event loop for seconds."""
    raw = list(queue_redis.lrange(keys.SETTLE_PENDING, 0, -1))
    for key in queue_redis.scan_iter(match=keys.settle_processing("*"), count=500):
        raw += queue_redis.lrange(key, 0, -1)
    if mentioning is not None:
        needle = json.dumps(mentioning)  # ids need no escaping, so every encoding holds this
        raw = [x for x in raw if needle in x]
    decoded: list[dict[str, Any]] = []
    for start in range(0, len(raw), 2000):
        decoded += [json.loads(x) for x in raw[start : start + 2000]]
        time.sleep(0)  # in a gevent web worker: let its requests run between chunks
    return decoded


def sales_in(item: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The sales of a queued settlement (its JSON, decoded), each with buyer_id, price,
    sold_at, lease, reserved_us and, when billed, charge: the item's own fields, then a shared
    lead's `more_sales` (leads/accounting/item.py). None unless sold."""
    if item.get("status") != "sold" or not item.get("buyer_id"):
        return []
    return [item, *(item.get("more_sales") or ())]
