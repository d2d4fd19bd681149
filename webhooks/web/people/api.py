"""Admin routes for operator users (`/v1/admin/users`, under the admin API's bearer token):
invite one (its set-up link in the answer, once), list them, read one, deactivate one
(`DELETE`: the row stays, no login or session of it works any more)."""

from __future__ import annotations

from flask import Blueprint, jsonify, url_for
from flask.typing import ResponseReturnValue

from webhooks.people import accounts
from webhooks.web import logins
from webhooks.web.http import json_body

bp = Blueprint("users_api", __name__, url_prefix="/v1/admin")
bp.before_request(logins.require_bearer)


def setup_link(token: str) -> str:
    """The set-up link of an invitation, on this site (webhooks/web/people/setup.py)."""
    return url_for("people.setup.setup_form", token=token, _external=True)


@bp.post("/users")
def create_user() -> ResponseReturnValue:
    email, role, tenant = accounts.parse_new(json_body())
    user, token = accounts.invite(email, role, tenant)
    body = {
        **accounts.to_json(user),
        "setup_url": setup_link(token),  # shown this once
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
