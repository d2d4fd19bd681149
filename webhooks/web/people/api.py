"""Admin routes for operator users (`/v1/admin/users`, under the admin API's bearer token):
invite one (its set-up link in the answer, once), list them, read one, deactivate one
(`DELETE`: the row stays, no login or session of it works)."""

from __future__ import annotations

from flask import Blueprint, jsonify, url_for
from flask.typing import ResponseReturnValue

from webhooks.web.http import json_body
from webhooks.web.people import accounts

bp = Blueprint("users", __name__)


@bp.post("/users")
def create_user() -> ResponseReturnValue:
    email, role = accounts.parse_new(json_body())
    user, token = accounts.invite(email, role)
    body = {
        **accounts.to_json(user),
        "setup_url": url_for("ops.setup.setup_form", token=token, _external=True),  # shown this once
        "setup_expires_at": user.setup_expires_at.isoformat() + "Z",
    }
    return jsonify(body), 201


@bp.get("/users")
def list_users() -> ResponseReturnValue:
    return jsonify(users=[accounts.to_json(u) for u in accounts.listed()])


@bp.get("/users/<int:user_id>")
def get_user(user_id: int) -> ResponseReturnValue:
    return jsonify(accounts.to_json(accounts.existing(user_id)))


@bp.delete("/users/<int:user_id>")
def deactivate_user(user_id: int) -> ResponseReturnValue:
    return jsonify(accounts.to_json(accounts.deactivate(user_id)))
