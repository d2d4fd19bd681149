"""Reconciliation of Redis cap counters with the ledger (see webhooks/caps/reconcile.py)."""
from __future__ import annotations

from webhooks.caps.reconcile import reconcile_all as run
from webhooks.leads.catalog import load_snapshot
from webhooks.storage.db import close_db
from workers.context import backends


def reconcile_all() -> list[dict]:
    b = backends()
    try:
        return run(b.store, b.settle.redis, load_snapshot(None).buyers)
    finally:
        close_db()
