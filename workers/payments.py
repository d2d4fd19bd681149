"""Provider reconciliation as a scheduled job (webhooks/payments/reconcile.py): every
PROVIDER_RECONCILE_INTERVAL_S, the successful payments of each configured provider's last
PROVIDER_RECONCILE_LOOKBACK_S that the ledger lacks are credited through the webhook's path.
A database or Redis outage ends a run quietly: the next one reads the window again."""

from __future__ import annotations

import logging
from typing import Any

from rq import get_current_job

from webhooks.payments import reconcile
from webhooks.payments.providers import payment_lists
from webhooks.payments.webhook import PaymentWebhooks
from webhooks.storage.live.redis import REDIS_DOWN, make_queue_redis
from webhooks.storage.live.settle_queue import queue
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, close_db, db
from workers.context import backends

log = logging.getLogger(__name__)


def reconcile_providers() -> list[dict[str, Any]]:
    """One run over every configured provider; a summary per provider. Through a database or
    Redis outage the run ends quietly: the next one (an interval later) reads the window again."""
    b = backends()
    job = get_current_job()
    q = queue(job.connection) if job else queue(make_queue_redis(b.cfg.queue_redis_url))
    hooks = PaymentWebhooks.build(b.cfg, b.store, b.queue_redis, q)
    listers = payment_lists.listers(b.cfg)
    if not listers:
        return []
    since = reconcile.window(b.cfg.provider_reconcile_lookback_s)
    try:
        with db.connection_context():
            done = reconcile.run(hooks, listers, since)
    except UNAVAILABLE_ERRORS as exc:
        log.warning("database unavailable (%s): provider reconciliation runs again next interval", exc)
        return []
    except REDIS_DOWN as exc:
        log.warning("Redis unavailable (%s): provider reconciliation runs again next interval", exc)
        return []
    finally:
        close_db()
    return [vars(p) for p in done.providers]
