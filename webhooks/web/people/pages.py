"""The console's operator users (`/ops/users`): the list, the invitation form (the set-up link
shown once, on the answer to the form) and deactivation, under the /ops session like every
console page. Every role reads the page; only an owner (or the admin token) changes anything:
webhooks/people/roles.py, checked once for every console route by webhooks/web/sessions.py."""

from __future__ import annotations

from flask import Blueprint, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from webhooks.errors import Conflict, ValidationError
from webhooks.people import accounts, roles
from webhooks.storage.records.models import AuditLog, Buyer, Publisher
from webhooks.web import sessions
from webhooks.web.people.api import setup_link

bp = Blueprint("users", __name__)
bp.before_request(sessions.require_admin)

SECTION = "people.users.users"
ROLES = frozenset(r.value for r in accounts.Role)
PICK = 500  # buyers and publishers offered in the invitation's pick-list (any id may be typed)
NO_STORE = {"Cache-Control": "no-store"}


def _page(status: int = 200, **context: object) -> tuple[str, int, dict[str, str]]:
    users = [accounts.to_json(u) for u in accounts.listed()]
    rows = AuditLog.select().where(AuditLog.entity == "user").order_by(AuditLog.id.desc()).limit(50)
    html = render_template(
        "users.html",
        section=SECTION,
        users=users,
        roles=[r.value for r in accounts.Role],
        buyers=[b.id for b in Buyer.select(Buyer.id).where(Buyer.deleted_at.is_null()).order_by(Buyer.id).limit(PICK)],
        publishers=[p.id for p in Publisher.select(Publisher.id).order_by(Publisher.id).limit(PICK)],
        audit=rows,
        manages=roles.manages_users(user.role if (user := g.get("ops_user")) is not None else None),
        **context,
    )
    return html, status, NO_STORE


@bp.get("/ops/users", endpoint="users")
def users_page() -> ResponseReturnValue:
    return _page()


@bp.post("/ops/users", endpoint="invite")
def invite() -> ResponseReturnValue:
    """Invite a user (of a portal role: tied to the form's `tenant`, a buyer or publisher id):
    the page again, with its set-up link (shown this once), or the refusal."""
    form = request.form
    body = {"email": form.get("email", ""), "role": form.get("role", "")}
    try:
        tenant = form.get("tenant", "").strip()
        if tenant:  # the form's one field for the buyer or publisher a portal user is tied to
            tie = accounts.TENANT_FIELD.get(accounts.Role(body["role"])) if body["role"] in ROLES else None
            if tie is None:
                raise ValidationError("invalid_user", "tenant", "only a buyer or publisher user is tied to one")
            body[tie] = tenant
        email, role, tied = accounts.parse_new(body)
        user, token = accounts.invite(email, role, tied)
    except (ValidationError, Conflict) as exc:
        return _page(400 if isinstance(exc, ValidationError) else 409, error=str(exc))
    return _page(201, invited=accounts.to_json(user), link=setup_link(token))


@bp.post("/ops/users/<int:user_id>/deactivate", endpoint="deactivate")
def deactivate(user_id: int) -> ResponseReturnValue:
    """Deactivate a user: back to the page; the page again saying why not for the last owner."""
    try:
        accounts.deactivate(user_id)
    except Conflict as exc:
        return _page(409, error=str(exc))
    return redirect(url_for(SECTION, notice="saved"), code=303)
