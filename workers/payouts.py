"""The release of publisher payouts whose hold is over (docs/leads.md "Payout holds"): run by
the scheduler every minute (workers/schedule.py), a batch of sales a transaction."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from webhooks.leads.accounting import payouts
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, close_db, db
from workers.context import backends

log = logging.getLogger(__name__)

TIME_BUDGET_S = 30.0  # well inside the job timeout (settle_queue.JOB_TIMEOUT); the rest waits a minute


def release_payouts(now: datetime | None = None, time_budget_s: float = TIME_BUDGET_S) -> int:
    """Make payable the held payouts whose hold ended by `now` (default: the clock); how many.
    A database outage ends the run quietly with what it did so far (each batch commits alone):
    the held payouts stay held, and the next run releases them."""
    backends()  # the database, as every job opens it
    at = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).replace(tzinfo=None)
    try:
        with db.connection_context():
            released = payouts.release(at, time_budget_s=time_budget_s)
    except UNAVAILABLE_ERRORS as exc:
        log.warning("database unavailable (%s): held payouts are released by the next run", exc)
        return 0
    finally:
        close_db()
    return released
