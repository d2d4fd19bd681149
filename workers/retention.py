"""The lead-body purge (docs/api.md "Data kept per lead is bounded"): unsold and test leads keep
their raw body LEAD_BODY_RETENTION_DAYS, sold ones SOLD_LEAD_BODY_RETENTION_DAYS; the ledger's
figures stay. Run by the scheduler every hour (workers/schedule.py); `flask leads purge`
runs it now."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from webhooks.leads.accounting import ledger
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, close_db, db
from workers.context import backends

log = logging.getLogger(__name__)

CHUNK = 500  # leads per statement: a short lock on a few hundred rows at a time
TIME_BUDGET_S = 60.0  # well inside the job timeout (settle_queue.JOB_TIMEOUT); the rest waits an hour


def purge_bodies(chunk: int = CHUNK, time_budget_s: float = TIME_BUDGET_S) -> dict[str, int]:
    """Empty the bodies kept past their retention; how many per group. A database or Redis
    outage ends the run quietly with what it did so far (each chunk commits alone, its mark
    saved after it): the next run carries on from there."""
    b = backends()
    groups = ledger.kept(b.cfg.lead_body_retention_days, b.cfg.sold_lead_body_retention_days)
    try:
        with db.connection_context():
            emptied = ledger.purge_bodies(
                b.queue_redis.redis, groups, datetime.now(timezone.utc), chunk=chunk, time_budget_s=time_budget_s
            )
    except UNAVAILABLE_ERRORS as exc:
        log.warning("database unavailable (%s): the lead-body purge carries on within the hour", exc)
        return {}
    except REDIS_DOWN as exc:
        log.warning("Redis unavailable (%s): the lead-body purge carries on within the hour", exc)
        return {}
    finally:
        close_db()
    if any(emptied.values()):
        log.info("lead bodies past their retention emptied: %s", emptied)
    return emptied
