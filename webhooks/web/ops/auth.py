"""The admin token for the operator pages, which a browser must be able to open: the admin API's
`Authorization: Bearer`, or `?token=` once, swapped for a session cookie (a random id in Redis,
bound to the token, expiring); under the cookie a change must come from the same origin.
docs/operations.md "`/ops` and `/ops/rq`", docs/security.md."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import cast
from urllib.parse import urlencode, urlsplit

from flask import redirect, request, url_for
from werkzeug.wrappers import Response  # what `redirect` makes (flask's Response is one)

from webhooks import services
from webhooks.errors import Forbidden
from webhooks.storage import keys
from webhooks.validate import bearer
from webhooks.web.admin import check_admin_token
from webhooks.web.ops import bp

COOKIE = "floodgate_ops"
COOKIE_PATH = "/ops"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _is_admin_token(presented: str | None) -> bool:
    token = services.current().config.admin_token
    if not presented or not token:
        return False
    return hmac.compare_digest(presented.encode(), token.encode())


def open_session() -> str:
    """A new session id (the cookie's value), kept in Redis for OPS_SESSION_TTL_S."""
    cfg = services.current().config
    session_id = secrets.token_urlsafe(32)
    services.current().store.redis.set(
        keys.ops_session(_digest(session_id)), _digest(cfg.admin_token), ex=cfg.ops_session_ttl_s
    )
    return session_id


def _session_is_live(session_id: str | None) -> bool:
    """The cookie names a session that has not expired, opened with today's admin token."""
    token = services.current().config.admin_token
    if not token or not session_id or len(session_id) > 128:
        return False
    stored = cast("str | None", services.current().store.redis.get(keys.ops_session(_digest(session_id))))  # decoded
    return stored is not None and hmac.compare_digest(stored.encode(), _digest(token).encode())


def same_origin() -> bool:
    """The browser says the request comes from a page of this site: Sec-Fetch-Site (sent by
    every current browser) is `same-origin`, or, without it, Origin names this host. Neither
    header: refused, as a cross-site form post from an old browser would look."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site.strip().lower() == "same-origin"
    origin = request.headers.get("Origin", "")
    if not origin or origin == "null":
        return False
    # Host only: behind a TLS proxy the app sees http while the browser's Origin says https.
    return urlsplit(origin).netloc.lower() == request.host.lower()


def _swap_token_for_cookie() -> Response:
    """303 to the same address without `?token=`, setting the session cookie."""
    cfg = services.current().config
    query = urlencode([(k, v) for k, v in request.args.items(multi=True) if k != "token"])
    resp = redirect(request.path + ("?" + query if query else ""), code=303)
    resp.set_cookie(
        COOKIE,
        open_session(),
        max_age=cfg.ops_session_ttl_s,
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=request.is_secure or not cfg.ops_insecure_cookie,
    )
    resp.headers["Cache-Control"] = "no-store"
    resp.headers["Referrer-Policy"] = "no-referrer"  # the address with the token goes nowhere
    return resp


def require_admin() -> Response | None:
    """before_request of the ops pages: pass, redirect to drop `?token=` from the address
    (setting the cookie), or raise: 403 for a cross-site change under the cookie, else the
    admin API's 401/503."""
    if _is_admin_token(bearer(request.headers.get("Authorization", ""))):
        return None  # a header no other site can make a browser send: no origin check needed
    if request.method in SAFE_METHODS and _is_admin_token(request.args.get("token")):
        return _swap_token_for_cookie()
    if _session_is_live(request.cookies.get(COOKIE)):
        if request.method not in SAFE_METHODS and not same_origin():
            raise Forbidden(
                "a change under the /ops cookie must come from this site's own pages (Origin / Sec-Fetch-Site)",
                code="cross_site_request",
            )
        return None
    check_admin_token()  # the header, or the JSON 401 / 503 answer
    return None


@bp.post("/ops/logout")
def logout() -> Response:
    """End this browser's /ops session: its id is deleted in Redis (the cookie is worthless
    from now on, wherever a copy of it is) and the cookie cleared. A change like any other:
    it must come from this site's own pages."""
    session_id = request.cookies.get(COOKIE)
    if session_id and not same_origin():
        raise Forbidden(
            "logout must come from this site's own pages (Origin / Sec-Fetch-Site)", code="cross_site_request"
        )
    if session_id and len(session_id) <= 128:
        services.current().store.redis.delete(keys.ops_session(_digest(session_id)))
    resp = redirect(url_for("ops.logged_out"), code=303)
    resp.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="Strict")
    resp.headers["Cache-Control"] = "no-store"
    return resp


@bp.get("/ops/logged-out")
def logged_out() -> Response:
    """Where a logout lands: a page that needs no session."""
    return Response(
        "<!doctype html><title>Floodgate ops</title><p>Logged out. Open /ops?token=... to log in again.",
        mimetype="text/html",
        headers={"Cache-Control": "no-store"},
    )
