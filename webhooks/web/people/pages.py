"""The console's operator users (`/ops/users`): the list, the invitation form (the set-up link
shown once, on the answer to the form) and deactivation. Every role reads the page; only an
owner (or the admin token) changes anything: webhooks/web/people/roles.py checks that, once,
for every console route."""

from __future__ import annotations

from flask import Blueprint, request, url_for
from flask.typing import ResponseReturnValue

from webhooks.errors import Conflict, ValidationError
from webhooks.web.ops.console import audit_rows, done, page
from webhooks.web.people import accounts

bp = Blueprint("users", __name__, template_folder="templates")

SECTION = "ops.users.users"


def setup_link(token: str) -> str:
    """The set-up link of an invitation, on this site."""
    return url_for("ops.setup.setup_form", token=token, _external=True)


def _page(status: int = 200, **context: object) -> tuple[str, int, dict[str, str]]:
    users = [accounts.to_json(u) for u in accounts.listed()]
    return page(
        "users.html",
        SECTION,
        status,
        users=users,
        roles=[r.value for r in accounts.Role],
        audit=audit_rows("user"),
        **context,
    )


@bp.get("/ops/users", endpoint="users")
def users_page() -> ResponseReturnValue:
    return _page()


@bp.post("/ops/users", endpoint="invite")
def invite() -> ResponseReturnValue:
    """Invite a user: the page again, with its set-up link (shown this once), or the refusal."""
    try:
        email, role = accounts.parse_new({"email": request.form.get("email", ""), "role": request.form.get("role")})
        user, token = accounts.invite(email, role)
    except (ValidationError, Conflict) as exc:
        return _page(400 if isinstance(exc, ValidationError) else 409, error=str(exc))
    return _page(201, invited=accounts.to_json(user), link=setup_link(token))


@bp.post("/ops/users/<int:user_id>/deactivate", endpoint="deactivate")
def deactivate(user_id: int) -> ResponseReturnValue:
    accounts.deactivate(user_id)
    return done(SECTION, "saved")
