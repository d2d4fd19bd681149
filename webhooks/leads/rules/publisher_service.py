"""A publisher's changes as the admin API, the console and the CLI all make them: stored, then
told to every process (a new one's claims remembered from its start, the config version
bumped), and a publisher as those faces show it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from webhooks.errors import NotFound
from webhooks.formats.validate import merge_patch
from webhooks.leads.rules import earnings, publishers
from webhooks.leads.rules.catalog import bump_version
from webhooks.storage.live import claims, keys
from webhooks.storage.live.redis import Store
from webhooks.storage.records.db import retried
from webhooks.storage.records.models import Publisher


def existing(publisher_id: str) -> Publisher:
    """The publisher; NotFound when there is none."""
    row = Publisher.get_or_none(Publisher.id == publisher_id)
    if row is None:
        raise NotFound(f"no publisher {publisher_id!r}")
    return row


def save(store: Store, publisher_id: str, fields: dict[str, Any]) -> Publisher:
    """Store a publisher's validated fields (publishers.parse) and tell every process. Two new
    publishers made at once can deadlock on MariaDB (each UPDATE of a missing row locks the gap
    the other INSERTs into): the loser is run again whole (db.retried), not answered 503."""
    saved = retried(lambda: publishers.save(publisher_id, fields), f"saving publisher {publisher_id}")
    announce(store, [saved])
    return saved[0]


def announce(store: Store, saved: Sequence[tuple[Publisher, bool]]) -> None:
    """Tell every process of publishers written (row, fresh): a new one's claims remembered
    from its start, an `epl` one's earnings counted from the ledger once (its first lead would
    otherwise wait for them), the config version bumped."""
    for row, fresh in saved:
        if fresh:
            claims.remember_from_start(store, row.id)
        if row.routing == "epl" and not store.redis.exists(keys.earnings_ready(row.id)):
            earnings.rebuild(store.redis, row.id, datetime.now(timezone.utc), int(row.epl_window_days))
    bump_version(store.redis)


def patch(store: Store, stored: Publisher, changes: dict[str, Any]) -> Publisher:
    """Apply a JSON merge patch (RFC 7396) to the publisher as GET shows it (`patched`) and save it."""
    return save(store, stored.id, patched(stored, changes))


def patched(stored: Publisher, changes: dict[str, Any]) -> dict[str, Any]:
    """The publisher's columns after a JSON merge patch (RFC 7396) of it as GET shows it,
    checked (ValidationErrors naming each bad field), not saved: fields not named are kept,
    its API key among them. A patch naming one of `commission_pct` and `payout` sets
    the payout by it alone (GET shows both), and a `payout` of another `type` replaces the
    stored one instead of merging into it (their fields differ)."""
    current = publishers.to_json(stored)
    if "commission_pct" in changes and "payout" not in changes:
        current.pop("payout")
    elif "payout" in changes and "commission_pct" not in changes:
        current.pop("commission_pct")
        if isinstance(changes["payout"], dict) and changes["payout"].get("type") != current["payout"].get("type"):
            current.pop("payout")  # another kind of payout replaces it, not merges into it
    return publishers.parse(merge_patch(current, changes), stored)


def shown(store: Store, rows: list[Publisher]) -> list[dict[str, Any]]:
    """Publishers as GET /v1/admin/publishers/<id> shows each (and the list, a page of them):
    the stored form and the live `usage` of each cap, read in one round trip for them all."""
    rules = [publishers.PublisherRule.from_row(row) for row in rows]
    usage = publishers.cap_usage_many(store, rules, datetime.now(timezone.utc))
    return [{**publishers.to_json(row), "usage": usage[row.id]} for row in rows]
