"""The set-up page of an invited operator user (`/ops/setup/<token>`, no session needed: the
token is the key, used once): choose a password and, for an owner or an admin, enrol the TOTP
second factor by entering a current code of the secret shown (as text and as an otpauth URI).
A change like any other page's: it must come from this site's own pages."""

from __future__ import annotations

from flask import Blueprint, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from webhooks.errors import Forbidden, NotFound
from webhooks.people import accounts
from webhooks.storage.records.models import User
from webhooks.web import logins
from webhooks.web.sessions import same_origin

bp = Blueprint("setup", __name__)

NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


def _form(user: User, token: str, error: str | None, status: int) -> tuple[str, int, dict[str, str]]:
    html = render_template(
        "setup.html",
        user=user,
        token=token,
        needs_code=accounts.Role(user.role) in accounts.TOTP_ROLES,
        secret=user.totp_secret,
        uri=accounts.otpauth_uri(user) if user.totp_secret else None,
        min_password=accounts.MIN_PASSWORD,
        error=error,
    )
    return html, status, NO_STORE


def _awaiting(token: str) -> User:
    user = accounts.awaiting_setup(token)
    if user is None:
        raise NotFound("this set-up link is unknown, used or expired: ask an owner for a new one")
    return user


@bp.get("/ops/setup/<token>")
def setup_form(token: str) -> tuple[str, int, dict[str, str]]:
    """The form: the password twice and, for an owner or an admin, the secret and a code."""
    return _form(_awaiting(token), token, None, 200)


@bp.post("/ops/setup/<token>")
def set_up(token: str) -> Response | tuple[str, int, dict[str, str]]:
    """Set the password (at least MIN_PASSWORD characters) once the code is right: 303 to the
    login form; 400 and the form again for a short password or a wrong code; 404 once the link
    is used or expired."""
    if not same_origin():
        raise Forbidden("the set-up form must be posted from this site's own page", code="cross_site_request")
    user = _awaiting(token)
    password = request.form.get("password", "")
    problem = accounts.password_problem(password, request.form.get("password_again", ""))
    if problem:
        return _form(user, token, problem, 400)
    step = None
    if accounts.Role(user.role) in accounts.TOTP_ROLES:
        step = accounts.code_matches(user, request.form.get("code", "").strip())
        if step is None:
            return _form(user, token, "That code is not the current one of this secret.", 400)
    done = accounts.complete_setup(token, password)
    if done is None:
        raise NotFound("this set-up link is unknown, used or expired: ask an owner for a new one")
    if step is not None:
        logins.code_taken(done, step)  # the code just used opens no login
    login = "portal.auth.login" if accounts.Role(done.role) in accounts.PORTAL_ROLES else "ops.auth.login"
    return redirect(url_for(login, notice="set_up"), code=303)
