"""Admin routes for publishers."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from flask import jsonify
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import NotFound
from webhooks.leads.rules import publishers
from webhooks.leads.rules.catalog import bump_version
from webhooks.storage.live import claims
from webhooks.storage.records.models import Publisher
from webhooks.web.admin import bp
from webhooks.web.http import json_body, merge_patch, patch_body


@bp.put("/publishers/<id:publisher_id>")
def put_publisher(publisher_id: str) -> ResponseReturnValue:
    return jsonify(publishers.to_json(save(publisher_id, publishers.parse(json_body()))))


@bp.patch("/publishers/<id:publisher_id>")
def patch_publisher(publisher_id: str) -> ResponseReturnValue:
    stored = existing(publisher_id)  # 404 before the body is looked at
    return jsonify(publishers.to_json(patch(stored, patch_body(publishers.CODE))))


def existing(publisher_id: str) -> Publisher:
    """The publisher; 404 not_found when there is none."""
    row = Publisher.get_or_none(Publisher.id == publisher_id)
    if row is None:
        raise NotFound(f"no publisher {publisher_id!r}")
    return row


def patch(stored: Publisher, changes: dict[str, Any]) -> Publisher:
    """Apply a JSON merge patch (RFC 7396) to the publisher as GET shows it: fields not named
    are kept, its API key among them. A patch naming one of `commission_pct` and `payout` sets
    the payout by it alone (GET shows both), and a `payout` of another `type` replaces the
    stored one instead of merging into it (their fields differ)."""
    current = publishers.to_json(stored)
    if "commission_pct" in changes and "payout" not in changes:
        current.pop("payout")
    elif "payout" in changes and "commission_pct" not in changes:
        current.pop("commission_pct")
        if isinstance(changes["payout"], dict) and changes["payout"].get("type") != current["payout"].get("type"):
            current.pop("payout")  # another kind of payout replaces it, not merges into it
    return save(stored.id, publishers.parse(merge_patch(current, changes), stored))


def save(publisher_id: str, fields: dict[str, Any]) -> Publisher:
    """Store a publisher's validated fields (publishers.parse) and tell every process: a new
    one's claims remembered from its start, the config version bumped."""
    row, fresh = publishers.save(publisher_id, fields)
    if fresh:
        claims.remember_from_start(services.current().store, publisher_id)
    bump_version(services.current().store.redis)
    return row


@bp.get("/publishers/<id:publisher_id>")
def get_publisher(publisher_id: str) -> ResponseReturnValue:
    return jsonify(shown([existing(publisher_id)])[0])


def shown(rows: list[Publisher]) -> list[dict[str, Any]]:
    """Publishers as GET /v1/admin/publishers/<id> shows each (and the list, a page of them):
    the stored form and the live `usage` of each cap, read in one round trip for them all."""
    rules = [publishers.PublisherRule.from_row(row) for row in rows]
    usage = publishers.cap_usage_many(services.current().store, rules, datetime.now(timezone.utc))
    return [{**publishers.to_json(row), "usage": usage[row.id]} for row in rows]
