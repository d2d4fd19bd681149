"""The audit log: one row per admin change, settlement, conflict or repair.

Who acted: a change made through the admin API or the console is recorded by its domain code
as made by "admin". When an operator user is logged in (webhooks/web/people/), the web layer
names that user for the request (`acting`), and every row that would say "admin" says
`user:<email>` instead: one place, whatever module writes the row. The admin token keeps
"admin"; the system's own actors ("payments", "reconcile", "cli", `buyer:<id>`) are kept."""

from __future__ import annotations

import json
from contextvars import ContextVar, Token
from typing import Any

from webhooks.storage.records import fastsql
from webhooks.storage.records.models import AuditLog, utcnow

ADMIN = "admin"

# The operator user acting in this request (its greenlet or thread), set by the web layer.
_acting: ContextVar[str | None] = ContextVar("audit_acting", default=None)


def acting(user: str | None) -> Token[str | None]:
    """Name `user` (`user:<email>`) as who acts until `reset(token)`; None: the admin token."""
    return _acting.set(user)


def reset(token: Token[str | None]) -> None:
    _acting.reset(token)


def who(actor: str) -> str:
    """`actor` as the log names it: the acting user instead of "admin" (a column that keeps
    who decided, a return's, takes it too)."""
    user = _acting.get()
    return user if actor == ADMIN and user is not None else actor


def record(actor: str, action: str, entity: str, entity_id: str, detail: Any = None) -> None:
    """Add an audit row (inside the caller's transaction, so it commits with the change)."""
    AuditLog.create(
        actor=who(actor),
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
                    "actor": who(actor),
                    "action": action,
                    "entity": entity,
                    "entity_id": entity_id,
                    "detail": json.dumps(detail, default=str, sort_keys=True),
                    "at": utcnow(),
                }
                for action, entity_id, detail in rows
            ],
        )
