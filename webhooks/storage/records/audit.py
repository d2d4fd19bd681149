"""The audit log: one row per admin change, settlement, conflict or repair."""

from __future__ import annotations

import json
from typing import Any

from webhooks.storage.records import fastsql
from webhooks.storage.records.models import AuditLog, utcnow


def record(actor: str, action: str, entity: str, entity_id: str, detail: Any = None) -> None:
    """Add an audit row (inside the caller's transaction, so it commits with the change)."""
    AuditLog.create(
        actor=actor,
        action=action,
        entity=entity,
        entity_id=entity_id,
        detail=None if detail is None else json.dumps(detail, default=str, sort_keys=True),
    )


def record_many(actor: str, entity: str, rows: list[tuple[str, str, Any]]) -> None:
    """Add one audit row per (action, entity_id, detail), in one statement."""
    if rows:
        fastsql.insert_many(
            AuditLog,
            [
                {
                    "actor": actor,
                    "action": action,
                    "entity": entity,
                    "entity_id": entity_id,
                    "detail": json.dumps(detail, default=str, sort_keys=True),
                    "at": utcnow(),
                }
                for action, entity_id, detail in rows
            ],
        )
