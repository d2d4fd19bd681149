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
from webhooks.storage import claims
from webhooks.storage.models import Publisher
from webhooks.web.admin import bp
from webhooks.web.http import json_body, merge_patch, patch_body


@bp.put("/publishers/<id:publisher_id>")
def put_publisher(publisher_id: str) -> ResponseReturnValue:
    row, fresh = publishers.save(publisher_id, publishers.parse(json_body()))
    if fresh:
        claims.remember_from_start(services.current().store, publisher_id)
    bump_version(services.current().store.redis)
    return jsonify(publishers.to_json(row))


@bp.patch("/publishers/<id:publisher_id>")
def patch_publisher(publisher_id: str) -> ResponseReturnValue:
    """A JSON merge patch (RFC 7396) of the publisher as GET shows it: fields not named are
    kept, its API key among them. A patch naming one of `commission_pct` and `payout` sets
    the payout by it alone (GET shows both), and a `payout` of another `type` replaces the
    stored one instead of merging into it (their fields differ)."""
    stored = Publisher.get_or_none(Publisher.id == publisher_id)
    if stored is None:
        raise NotFound(f"no publisher {publisher_id!r}")
    patch = patch_body(publishers.CODE)
    current = publishers.to_json(stored)
    if "commission_pct" in patch and "payout" not in patch:
        current.pop("payout")
    elif "payout" in patch and "commission_pct" not in patch:
        current.pop("commission_pct")
        if isinstance(patch["payout"], dict) and patch["payout"].get("type") != current["payout"].get("type"):
            current.pop("payout")  # another kind of payout replaces it, not merges into it
    row, _ = publishers.save(publisher_id, publishers.parse(merge_patch(current, patch), stored))
    bump_version(services.current().store.redis)
    return jsonify(publishers.to_json(row))


@bp.get("/publishers/<id:publisher_id>")
def get_publisher(publisher_id: str) -> ResponseReturnValue:
    row = Publisher.get_or_none(Publisher.id == publisher_id)
    if row is None:
        raise NotFound(f"no publisher {publisher_id!r}")
    return jsonify(shown([row])[0])


def shown(rows: list[Publisher]) -> list[dict[str, Any]]:
    """Publishers as GET /v1/admin/publishers/<id> shows each (and the list, a page of them):
    the stored form and the live `usage` of each cap, read in one round trip for them all."""
    rules = [publishers.PublisherRule.from_row(row) for row in rows]
    usage = publishers.cap_usage_many(services.current().store, rules, datetime.now(timezone.utc))
    return [{**publishers.to_json(row), "usage": usage[row.id]} for row in rows]
