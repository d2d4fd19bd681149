"""The portals' way in and out: the login form (`POST /portal/login`: a buyer or publisher
user's e-mail and password, no second factor), and logout. An operator user's password opens
no portal session, and a portal user's opens no /ops session (webhooks/web/logins.py
`sign_in`, webhooks/web/sessions.py)."""

from __future__ import annotations

import hmac

from flask import Blueprint, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from webhooks.errors import Forbidden, TooManyAttempts
from webhooks.people import accounts
from webhooks.web import logins, sessions

bp = Blueprint("auth", __name__)

HOME = {accounts.Role.BUYER: "portal.buyer.home", accounts.Role.PUBLISHER: "portal.publisher.home"}
NOTICES = {"set_up": "Your login is set up: log in.", "logged_out": "Logged out."}


def _form(error: str | None, status: int) -> tuple[str, int, dict[str, str]]:
    html = render_template("portal_login.html", error=error, notice=NOTICES.get(request.args.get("notice", "")))
    return html, status, {"Cache-Control": "no-store"}


@bp.get("/portal")
def start() -> Response:
    """The portal's address as a person types it: its user's portal, else the login form."""
    found = sessions.portal_session()
    if found is None:
        return redirect(url_for("portal.auth.login"), code=303)
    return redirect(url_for(HOME[accounts.Role(found[1].role)]), code=303)


@bp.get("/portal/login")
def login() -> tuple[str, int, dict[str, str]]:
    return _form(None, 200)


@bp.post("/portal/login")
def log_in() -> Response | tuple[str, int, dict[str, str]]:
    """303 to the user's portal with the cookie set; 401 and the form again for anything wrong;
    429 (with Retry-After) once this address used up its tries (webhooks/web/logins.py)."""
    if not sessions.same_origin():
        raise Forbidden("the login form must be posted from this site's own page", code="cross_site_request")
    form = request.form
    try:
        user = logins.sign_in(form.get("email", ""), form.get("password", ""), "", accounts.PORTAL_ROLES)
    except TooManyAttempts as exc:
        html, status, headers = _form("Too many failed logins from this address: wait a few minutes.", 429)
        return html, status, {**headers, "Retry-After": str(exc.retry_after_s)}
    if user is None:
        return _form("Wrong e-mail or password.", 401)
    return sessions.set_portal_cookie(redirect(url_for(HOME[accounts.Role(user.role)]), code=303), user)


@bp.post("/portal/logout")
def logout() -> Response:
    """End this browser's portal session (deleted in Redis) and clear the cookie; a change like
    any other, from this site's pages with the session's CSRF token."""
    found = sessions.portal_session()
    if found is not None:
        session_id, _user, csrf = found
        presented = request.form.get(sessions.CSRF_FIELD, "")
        if not sessions.same_origin() or not hmac.compare_digest(presented.encode(), csrf.encode()):
            raise Forbidden("this form is stale or was not made by /portal: reload the page", code="csrf_token_invalid")
        sessions.end_portal_session(session_id)
    resp = redirect(url_for("portal.auth.login", notice="logged_out"), code=303)
    resp.delete_cookie(sessions.PORTAL_COOKIE, path=sessions.PORTAL_PATH, httponly=True, samesite="Strict")
    return resp
