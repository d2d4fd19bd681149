"""Admin routes of suppression lists (docs/api.md "Consent, suppression and pre-ping")."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.leads.rules import suppression
from webhooks.leads.rules.catalog import bump_version
from webhooks.storage.records.models import SuppressionList
from webhooks.web.http import body_limit, json_body

bp = Blueprint("suppression", __name__)


@bp.put("/suppression-lists/<id:list_id>")
def put_suppression_list(list_id: str) -> ResponseReturnValue:
    """Create a list, or keep it: {"field": "email" | "phone", "hash": "md5" | "sha256" | "none"}."""
    field, kind = suppression.parse_list(json_body())
    svc = services.current()
    store = svc.store
    row = suppression.put_list(store, list_id, field, kind, key=svc.config.suppression_key.encode())
    bump_version(store.redis)  # the lead path's snapshot knows every list
    return jsonify(suppression.to_json(row))


@bp.get("/suppression-lists/<id:list_id>")
def get_suppression_list(list_id: str) -> ResponseReturnValue:
    return jsonify(suppression.to_json(suppression.get_list(list_id)))


@bp.get("/suppression-lists")
def list_suppression_lists() -> ResponseReturnValue:
    rows = SuppressionList.select().order_by(SuppressionList.id)
    return jsonify({"lists": [suppression.to_json(row) for row in rows]})


@bp.post("/suppression-lists/<id:list_id>/entries")
def change_suppression_entries(list_id: str) -> ResponseReturnValue:
    """{"add": [...], "remove": [...]}, at most 10,000 values: 200 {"added", "removed", "size"}."""
    request.max_content_length = body_limit(request.path, current_app.config["MAX_CONTENT_LENGTH"])
    svc = services.current()
    row = suppression.get_list(list_id)  # 404 before the body is read
    rule = suppression.writable(row, svc.config.suppression_key.encode())
    add, remove = suppression.parse_entries(rule, json_body())
    return jsonify(suppression.change(svc.store, rule, add, remove))
