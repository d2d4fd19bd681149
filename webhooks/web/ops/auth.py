"""The console's way in and out: the login form (`POST /ops/login`: an operator user's e-mail,
password and TOTP code, or the admin token), logout, and the check before every console page
(`guard`). The session, CSRF and same-origin rules themselves: webhooks/web/sessions.py.
docs/operations.md "`/ops`: the operator console", docs/security.md."""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Blueprint, current_app, redirect, render_template, request, url_for
from werkzeug.wrappers import Response  # what `redirect` makes (flask's Response is one)

from webhooks import services
from webhooks.errors import TooManyAttempts
from webhooks.storage.live import keys
from webhooks.web import logins
from webhooks.web.http import body_limit
from webhooks.web.sessions import (  # the session rules this form opens and ends sessions under
    COOKIE,
    COOKIE_PATH,
    check_change,
    digest,
    live_session,
    require_admin,
    set_session_cookie,
)

bp = Blueprint("auth", __name__)

# Reached without a session: the login form itself, and where a logout lands.
OPEN = frozenset(
    {
        "ops.auth.login",
        "ops.auth.log_in",
        "ops.auth.logged_out",
        "ops.auth.logout",
    }
)


def guard() -> Response | None:
    """before_request of every console route (the package's blueprint runs it for each)."""
    if request.endpoint in OPEN or not request.path.startswith(COOKIE_PATH):
        return None  # the health, metrics and OpenAPI routes share the blueprint
    # before the form is read (its CSRF token): an upload's larger cap (web/http.py)
    request.max_content_length = body_limit(request.path, current_app.config["MAX_CONTENT_LENGTH"])
    return require_admin()


def _next_page(raw: str | None) -> str:
    """Where the login form sends the browser: a page of /ops, never another site."""
    if not raw or not raw.startswith(COOKIE_PATH) or raw.startswith("//") or "\\" in raw or len(raw) > 2000:
        return url_for("ops.page.ops_page")
    parts = urlsplit(raw)
    if parts.scheme or parts.netloc:
        return url_for("ops.page.ops_page")
    return raw


LOGIN_NOTICES = {"set_up": "Your login is set up: log in."}  # ?notice= on the form, from this list only


def _login_form(error: str | None, status: int, form: str = "token") -> tuple[str, int, dict[str, str]]:
    """The login page: the user's form and the admin token's; `error` shown in `form`'s."""
    html = render_template(
        "login.html",
        next=_next_page(request.values.get("next")),
        error=error,
        form=form,
        notice=LOGIN_NOTICES.get(request.args.get("notice", "")),
    )
    return html, status, {"Cache-Control": "no-store"}


@bp.get("/ops/login")
def login() -> tuple[str, int, dict[str, str]]:
    """The login form: the admin token in a password field, posted (never in an address)."""
    return _login_form(None, 200)


@bp.post("/ops/login")
def log_in() -> Response | tuple[str, int, dict[str, str]]:
    """Open a session: for an operator user's `email`, `password` and (owner, admin) `code`
    (webhooks/web/people/signin.py), or for the admin token in the form's `token` field. 303 to
    `next` with the cookie set; 401 and the form again for anything wrong; 429 (with
    Retry-After) once this address used up its tries (webhooks/web/logins.py)."""
    if request.form.get("email"):
        return _user_log_in()
    if not logins.configured():
        logins.refuse()  # 503 admin_disabled: no login can succeed
    try:
        right = logins.attempt(request.form.get("token", ""))
    except TooManyAttempts as exc:
        html, status, headers = _login_form("Too many wrong tokens from this address: wait a few minutes.", 429)
        return html, status, {**headers, "Retry-After": str(exc.retry_after_s)}
    if not right:
        return _login_form("That is not the admin token.", 401)
    return set_session_cookie(redirect(_next_page(request.form.get("next")), code=303))


def _user_log_in() -> Response | tuple[str, int, dict[str, str]]:
    form = request.form
    try:
        user = logins.sign_in(form.get("email", ""), form.get("password", ""), form.get("code", ""))
    except TooManyAttempts as exc:
        html, status, headers = _login_form(
            "Too many failed logins from this address: wait a few minutes.", 429, "user"
        )
        return html, status, {**headers, "Retry-After": str(exc.retry_after_s)}
    if user is None:
        return _login_form("Wrong e-mail, password or code.", 401, "user")
    return set_session_cookie(redirect(_next_page(form.get("next")), code=303), user)


@bp.post("/ops/logout")
def logout() -> Response:
    """End this browser's /ops session: its id is deleted in Redis (the cookie is worthless
    from now on, wherever a copy of it is) and the cookie cleared. A change like any other: it
    must come from this site's own pages with the session's CSRF token. Without a live session
    there is nothing to end: the cookie is cleared all the same."""
    session_id = live_session()
    if session_id is not None:
        check_change(session_id, csrf=True)
        services.current().store.redis.delete(keys.ops_session(digest(session_id)))
    resp = redirect(url_for("ops.auth.logged_out"), code=303)
    resp.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="Strict")
    resp.headers["Cache-Control"] = "no-store"
    return resp


@bp.get("/ops/logged-out")
def logged_out() -> tuple[str, int, dict[str, str]]:
    """Where a logout lands: the login form, saying so."""
    html = render_template("login.html", next=url_for("ops.page.ops_page"), error=None, notice="Logged out.")
    return html, 200, {"Cache-Control": "no-store"}
