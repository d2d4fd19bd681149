"""Plain suppression lists written before sql/021 rewritten as keyed hashes (`floodgate
suppression rehash`; docs/leads.md "Suppression lists"), from the database alone: an old entry
is the bare digest a keyed one is made of."""

from __future__ import annotations

import logging
import uuid

from webhooks.errors import Conflict
from webhooks.leads.rules.catalog import bump_version
from webhooks.leads.rules.suppression import LOCK_TTL_MS, ListRule, key_id, keyed_digest, locked, rebuild, writing
from webhooks.storage.live import keys
from webhooks.storage.live.redis import Store
from webhooks.storage.records import audit
from webhooks.storage.records.db import db
from webhooks.storage.records.models import SuppressionEntry, SuppressionList, utcnow

log = logging.getLogger(__name__)

PAGE = 1000


def plain_lists() -> list[str]:
    """Every list of hash "none", by id."""
    with db.connection_context():
        return sorted(
            row.id for row in SuppressionList.select(SuppressionList.id).where(SuppressionList.hash == "none")
        )


def rehash(store: Store, list_id: str, key: bytes) -> int:
    """Rewrite a plain list's bare digests as keyed hashes under `key` in the database, then
    load Redis again from it (its old buckets emptied first); how many entries were rewritten
    (0 for a list keyed before: run twice, or after an interruption, it only reloads). While it
    runs the list's ready key is gone, so a lead checked against it meets "unknown" (the buyer
    skipped, the publisher's lead 503), never a list that passes what it holds. Conflict while
    a load of the list runs."""
    token = uuid.uuid4().hex
    lock = keys.suppression_rebuild_lock(list_id)
    if not store.redis.set(lock, token, nx=True, px=LOCK_TTL_MS):
        raise Conflict(f"suppression list {list_id!r} is being loaded into Redis: run again shortly")
    try:
        store.redis.delete(keys.suppression_ready(list_id))
        with db.connection_context():
            rewritten, row = _rewrite(list_id, key)
        if row is None:
            return 0
        bump_version(store.redis)  # every process reads the list as keyed from now on
        _empty_in_redis(store, list_id)
        loaded = rebuild(store, ListRule.from_row(row, key))
        log.info(
            "suppression list %s keyed (%s): %d entries rewritten, %d loaded",
            list_id,
            row.digest_key,
            rewritten,
            loaded,
        )
        return rewritten
    finally:
        store.release_claim(lock, token)


def _rewrite(list_id: str, key: bytes) -> tuple[int, SuppressionList | None]:
    """(entries rewritten, the list) in one transaction that holds the list's row: an admin
    change waits for it, then finds the list rehashed (409). (0, None) for no plain list."""
    with writing():
        row = locked(list_id)
        if row is None or row.hash != "none":
            return 0, None
        if row.digest_key is not None:
            return 0, row
        query = SuppressionEntry.select(SuppressionEntry.digest).where(SuppressionEntry.list_id == list_id)
        old = [bytes.fromhex(entry.digest) for entry in query]
        SuppressionEntry.delete().where(SuppressionEntry.list_id == list_id).execute()
        for i in range(0, len(old), PAGE):
            rows = [{"list_id": list_id, "digest": keyed_digest(key, d).hex()} for d in old[i : i + PAGE]]
            SuppressionEntry.insert_many(rows).on_conflict_ignore().execute()
        SuppressionList.update(digest_key=key_id(key), size=len(old), updated_at=utcnow()).where(
            SuppressionList.id == list_id
        ).execute()
        audit.record("cli", "suppression_list.rehash", "suppression_list", list_id, {"entries": len(old)})
        return len(old), SuppressionList.get_by_id(list_id)


def _empty_in_redis(store: Store, list_id: str) -> None:
    """Delete every bucket of the list (the bare digests among them)."""
    pattern = keys.suppression_bucket(list_id, "[0-9a-f]" * 4)
    found = list(store.redis.scan_iter(match=pattern, count=PAGE))
    for i in range(0, len(found), PAGE):
        store.redis.delete(*found[i : i + PAGE])
