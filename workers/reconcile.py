"""Reconciliation of Redis cap counters with the ledger (see webhooks/caps/reconcile.py)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from rq import get_current_job

from webhooks.caps.reconcile import reconcile_all as run
from webhooks.leads.rules.catalog import load_snapshot
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.live.settle_queue import JOB_TIMEOUT, queue
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, close_db
from workers.context import backends

log = logging.getLogger(__name__)

OUTAGE_RETRY_S = 60


def reconcile_all() -> list[dict[str, Any]]:
    """Reconcile every active buyer. Through a database outage the run ends quietly and asks
    for another a minute later (the hourly job would otherwise leave a failed job in RQ's
    registry, an operator's alarm, for an outage that heals by itself: the soak found one
    when an outage met the run that follows every Redis restart). A run cut short has
    corrected some buyers: each correction is a delta, safe to repeat."""
    b = backends()
    try:
        return run(b.store, b.queue_redis.redis, load_snapshot(None).buyers)
    except UNAVAILABLE_ERRORS as exc:
        job = get_current_job()
        try:
            if job is not None:  # the worker's own scheduler (--with-scheduler) runs it
                queue(job.connection).enqueue_in(
                    timedelta(seconds=OUTAGE_RETRY_S),
                    "workers.reconcile.reconcile_all",
                    job_timeout=JOB_TIMEOUT,
                    description="reconcile caps (after an outage)",
                )
        except REDIS_DOWN as redis_exc:
            log.warning("Redis unavailable too (%s): reconciliation runs again at its next interval", redis_exc)
            return []
        log.warning("database unavailable (%s): reconciliation runs again in %d s", exc, OUTAGE_RETRY_S)
        return []
    except REDIS_DOWN as exc:  # its next hourly run; a Redis that lost its counters rebuilds them first
        log.warning("Redis unavailable (%s): reconciliation runs again at its next interval", exc)
        return []
    finally:
        close_db()
