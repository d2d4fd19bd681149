"""Admin routes for publishers."""

from __future__ import annotations

from datetime import datetime, timezone

from flask import jsonify
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import NotFound
from webhooks.leads.rules import publishers
from webhooks.leads.rules.catalog import bump_version
from webhooks.storage import claims
from webhooks.storage.models import Publisher
from webhooks.web.admin import bp
from webhooks.web.http import json_body


@bp.put("/publishers/<id:publisher_id>")
def put_publisher(publisher_id: str) -> ResponseReturnValue:
    row, fresh = publishers.save(publisher_id, publishers.parse(json_body()))
    if fresh:
        claims.remember_from_start(services.current().store, publisher_id)
    bump_version(services.current().store.redis)
    return jsonify(publishers.to_json(row))


@bp.get("/publishers/<id:publisher_id>")
def get_publisher(publisher_id: str) -> ResponseReturnValue:
    row = Publisher.get_or_none(Publisher.id == publisher_id)
    if row is None:
        raise NotFound(f"no publisher {publisher_id!r}")
    now = datetime.now(timezone.utc)
    usage = publishers.cap_usage(services.current().store, publishers.PublisherRule.from_row(row), now)
    return jsonify({**publishers.to_json(row), "usage": usage})
