"""What the ledger keeps of a lead's consumer for the lead search's `?q=` (sql/030): its e-mail
and phone as their consumer keys, each as a keyed digest, never the value (docs/leads.md "What a
lead leaves behind"); and their backfill for leads settled before them."""

from __future__ import annotations

import hashlib
import json

from webhooks.formats import consumer
from webhooks.formats.consumer import DEFAULT_SUPPRESSION_KEY
from webhooks.leads.rules.suppression import keyed_digest
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead

DEFAULT_KEY = DEFAULT_SUPPRESSION_KEY.encode()  # SUPPRESSION_KEY unset: the embedded run's and the tests'
COLUMNS = tuple(f"{field}_digest" for field in consumer.FIELDS)  # email_digest, phone_digest


def digest(key: bytes, value: str) -> str:
    """What a lead keeps of one of its consumer keys, in hex: the entry a plain suppression
    list keyed under `key` (SUPPRESSION_KEY) holds for it."""
    return keyed_digest(key, hashlib.sha256(value.encode()).digest()[:16]).hex()


def digests(payload: str, key: bytes) -> dict[str, str | None]:
    """The lookup columns of a lead whose body is `payload`: its e-mail and phone as their
    consumer keys (the normaliser of dedupe and suppression), digested; None for a field it
    has not, or that names no consumer."""
    try:
        fields = json.loads(payload) if payload else None
    except ValueError:
        fields = None
    values = consumer.stored_keys_of(fields, consumer.FIELDS) if isinstance(fields, dict) else {}
    out: dict[str, str | None] = {}
    for field, column in zip(consumer.FIELDS, COLUMNS, strict=True):
        value = values.get(field)
        out[column] = None if value is None else digest(key, value)
    return out


def backfill_chunk(key: bytes, after_id: int, size: int) -> tuple[int, int | None]:
    """Write the digests of up to `size` leads after row `after_id` that have a body and no
    digest (settled before sql/030), in the ledger's id order: (how many were written, the
    last id looked at: None once none is left). Safe to repeat and beside settlement: a lead
    that has a digest is never written, nor one whose body changed since it was read (erased or
    purged meanwhile: its digests must stay empty)."""
    rows = list(
        Lead.select(Lead.id, Lead.payload, Lead.email_digest, Lead.phone_digest)
        .where(Lead.id > after_id)
        .order_by(Lead.id)
        .limit(size)
    )
    if not rows:
        return 0, None
    written = 0
    with db.atomic():
        for row in rows:
            if row.email_digest is not None or row.phone_digest is not None or not row.payload:
                continue
            found = digests(row.payload, key)
            if any(found.values()):
                written += (
                    Lead.update(found)
                    .where(
                        Lead.id == row.id,
                        Lead.email_digest.is_null(),
                        Lead.phone_digest.is_null(),
                        Lead.payload == row.payload,  # not erased or purged since it was read
                    )
                    .execute()
                )
    return written, rows[-1].id
