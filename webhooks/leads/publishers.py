"""Publishers: admin validation, stored form, and API-key lookup by hash."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from webhooks import validate as v
from webhooks.errors import ValidationError
from webhooks.storage.models import Publisher

CODE = "invalid_publisher"
_FIELDS = {"name", "api_key", "commission_pct", "active", "routing"}
ROUTING_MODES = ("waterfall", "price", "round_robin", "weighted")
_READ_ONLY = {"id", "api_key_hint", "balance", "created_at", "updated_at"}


def key_hash(api_key: str) -> str:
    """Only a hash of an API key is stored; lookups hash the presented key."""
    return hashlib.sha256(api_key.encode()).hexdigest()


def parse(body: Any) -> dict:
    """Validate an admin PUT body; return the column values of the Publisher row."""
    body = v.fields(CODE, body, _FIELDS, _READ_ONLY, ("name", "api_key"))
    api_key = v.text(CODE, "api_key", body["api_key"], min_len=16, max_len=200)
    pct = v.money(CODE, "commission_pct", body.get("commission_pct", "0"), max_value=Decimal(100))
    return {
        "name": v.text(CODE, "name", body["name"], max_len=200),
        "api_key_hash": key_hash(api_key),
        "api_key_hint": api_key[-4:],
        "commission_pct": pct,
        "active": v.boolean(CODE, "active", body.get("active", True)),
        "routing": _routing(body.get("routing", "waterfall")),
    }


def _routing(value: Any) -> str:
    if value not in ROUTING_MODES:
        raise ValidationError(CODE, "routing", "must be one of " + ", ".join(ROUTING_MODES))
    return value


def to_json(row: Publisher) -> dict:
    return {
        "id": row.id,
        "name": row.name,
        "api_key_hint": "…" + row.api_key_hint,
        "commission_pct": f"{Decimal(row.commission_pct):.2f}",
        "active": bool(row.active),
        "routing": row.routing,
        "balance": f"{Decimal(row.balance):.2f}",
        "created_at": row.created_at.isoformat() + "Z",
        "updated_at": row.updated_at.isoformat() + "Z",
    }


@dataclass(frozen=True)
class PublisherRule:
    id: str
    active: bool
    commission_pct: Decimal
    routing: str = "waterfall"

    @classmethod
    def from_row(cls, row: Publisher) -> PublisherRule:
        return cls(row.id, bool(row.active), Decimal(row.commission_pct), row.routing)


def save(publisher_id: str, fields: dict) -> tuple[Publisher, bool]:
    """Create or replace a publisher; an API key already used by another one is refused.
    Returns (row, fresh): fresh when it was created and the ledger has no lead of it (so
    Redis can remember every answer it is given: claims.remember_from_start)."""
    from webhooks.storage import audit
    from webhooks.storage.db import db
    from webhooks.storage.models import Lead, utcnow

    now = utcnow()
    with db.atomic():
        taken = Publisher.select().where(
            Publisher.api_key_hash == fields["api_key_hash"], Publisher.id != publisher_id
        ).exists()
        if taken:
            raise ValidationError(CODE, "api_key", "is already used by another publisher")
        fresh = False
        if not Publisher.update(**fields, updated_at=now).where(Publisher.id == publisher_id).execute():
            Publisher.create(id=publisher_id, **fields, created_at=now, updated_at=now)
            fresh = not Lead.select().where(Lead.publisher_id == publisher_id).exists()
        detail = {k: val for k, val in fields.items() if k != "api_key_hash"}
        audit.record("admin", "publisher.put", "publisher", publisher_id, detail)
    return Publisher.get_by_id(publisher_id), fresh
