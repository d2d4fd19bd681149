"""Reconciliation of Redis cap counters with the ledger (see webhooks/reconcile.py)."""
from __future__ import annotations

from webhooks.db import close_db
from workers.context import backends


def reconcile_all() -> list[dict]:
    from webhooks.reconcile import reconcile_all as run

    b = backends()
    try:
        return run(b.redis, b.settle_redis)
    finally:
        close_db()
