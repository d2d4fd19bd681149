"""Admin routes for publishers (their changes: leads/rules/publisher_service.py)."""

from __future__ import annotations

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.leads.rules import publisher_service, publishers
from webhooks.web.http import json_body, patch_body

bp = Blueprint("publishers", __name__)


@bp.put("/publishers/<id:publisher_id>")
def put_publisher(publisher_id: str) -> ResponseReturnValue:
    fields = publishers.parse(json_body())
    return jsonify(publishers.to_json(publisher_service.save(services.current().store, publisher_id, fields)))


@bp.patch("/publishers/<id:publisher_id>")
def patch_publisher(publisher_id: str) -> ResponseReturnValue:
    stored = publisher_service.existing(publisher_id)  # 404 before the body is looked at
    changed = publisher_service.patch(services.current().store, stored, patch_body(publishers.CODE))
    return jsonify(publishers.to_json(changed))


@bp.get("/publishers/<id:publisher_id>")
def get_publisher(publisher_id: str) -> ResponseReturnValue:
    store = services.current().store
    return jsonify(publisher_service.shown(store, [publisher_service.existing(publisher_id)])[0])
