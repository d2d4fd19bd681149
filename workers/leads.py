"""The abandoned-lead sweep (webhooks/leads/path/recovery.py): leads whose routing died while a
buyer held them and whose publisher never retried are offered again to that buyer and
settled. Run by the scheduler every minute (workers/schedule.py)."""

from __future__ import annotations

import logging
from typing import Any

from rq import get_current_job

from webhooks.leads.path import recovery
from webhooks.storage.live.redis import REDIS_DOWN, make_queue_redis
from webhooks.storage.live.settle_queue import queue
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, close_db
from workers.context import backends

log = logging.getLogger(__name__)


def sweep_abandoned(after_ms: int | None = None) -> dict[str, Any]:
    """Finish the abandoned leads (older than `after_ms`, default LEAD_ABANDONED_AFTER_MS);
    how many were sold, left unsold for review, and left for the next run. A database outage
    or Redis outage ends the run quietly: the next one, a minute later, finds the same leads."""
    b = backends()
    job = get_current_job()
    q = queue(job.connection if job else make_queue_redis(b.cfg.queue_redis_url))
    try:
        result = recovery.sweep_all(b.cfg, b.store, b.queue_redis, q, after_ms)
    except UNAVAILABLE_ERRORS as exc:
        log.warning("database unavailable (%s): the abandoned-lead sweep runs again within a minute", exc)
        return {"sold": 0, "unsold": 0, "left": 0}
    except REDIS_DOWN as exc:
        log.warning("Redis unavailable (%s): the abandoned-lead sweep runs again within a minute", exc)
        return {"sold": 0, "unsold": 0, "left": 0}
    finally:
        close_db()
    if result.sold or result.unsold or result.left:
        log.warning("abandoned-lead sweep: %s", result.as_dict())
    return result.as_dict()
