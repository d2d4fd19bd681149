"""Who may open the operator pages (webhooks/web/ops/ and webhooks/web/people/), which a
browser must be able to use: the admin API's `Authorization: Bearer`, or a session opened by
the login form (webhooks/web/ops/auth.py: an operator user's e-mail, password and TOTP code,
or the admin token, in the form's body, never in an address) and kept as a cookie (a random id
in Redis, bound to the admin token or to the user, expiring). A GET with the right `?token=`
(the way in before the form, which the contract keeps) opens a session too and answers the
address without it. Under the cookie a change must come from this site's own pages (the
same-origin check) and carry the session's CSRF token (the hidden field `csrf_token`), and a
user's role must allow it (webhooks/people/roles.py, checked here for every page). A browser
without a session is sent to the login form. Every token or password presented on any of
these ways is a try, counted per client address (webhooks/web/logins.py). docs/operations.md
"`/ops`: the operator console", docs/security.md."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import cast
from urllib.parse import urlencode, urlsplit

from flask import g, redirect, request, url_for
from werkzeug.wrappers import Response  # what `redirect` makes (flask's Response is one)

from webhooks import services
from webhooks.errors import Forbidden, NotFound
from webhooks.formats.validate import bearer
from webhooks.people import accounts, roles
from webhooks.storage.live import keys
from webhooks.storage.records import audit
from webhooks.storage.records.models import User
from webhooks.web import logins

COOKIE = "floodgate_ops"
COOKIE_PATH = "/ops"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


USER_SESSION = "user:"  # the stored value of a user's session: user:<id>:<csrf token>


def open_session(user: User | None = None) -> str:
    """A new session id (the cookie's value), kept in Redis for OPS_SESSION_TTL_S: bound to
    today's admin token, or (`user`) to an operator user and a CSRF token of its own."""
    cfg = services.current().config
    session_id = secrets.token_urlsafe(32)
    value = digest(cfg.admin_token) if user is None else f"{USER_SESSION}{user.id}:{secrets.token_hex(32)}"
    services.current().store.redis.set(keys.ops_session(digest(session_id)), value, ex=cfg.ops_session_ttl_s)
    return session_id


def live_session() -> str | None:
    """The cookie's session id when it names a session that has not expired, opened with
    today's admin token or by a user still active (then `g.ops_user` and `g.ops_user_csrf`)."""
    session_id = request.cookies.get(COOKIE)
    token = services.current().config.admin_token
    if not session_id or len(session_id) > 128:
        return None
    stored = cast("str | None", services.current().store.redis.get(keys.ops_session(digest(session_id))))  # decoded
    if stored is not None and stored.startswith(USER_SESSION):
        user_id, _, csrf = stored.removeprefix(USER_SESSION).partition(":")
        user = accounts.active(int(user_id)) if user_id.isdigit() else None
        if user is None or accounts.Role(user.role) not in accounts.OPERATOR_ROLES:
            return None  # a portal user's session never opens /ops
        g.ops_user, g.ops_user_csrf = user, csrf
        return session_id
    if not token or stored is None or not hmac.compare_digest(stored.encode(), digest(token).encode()):
        return None
    return session_id


def csrf_token(session_id: str) -> str:
    """The session's CSRF token: a user's is random, kept with its session; the admin token's
    is derived from its id and the admin token, so it needs no storage, differs per session and
    is worthless once either changes."""
    if g.get("ops_user") is not None:
        return str(g.ops_user_csrf)
    token = services.current().config.admin_token
    return hmac.new(token.encode(), b"ops-csrf:" + session_id.encode(), hashlib.sha256).hexdigest()


def form_token() -> str:
    """The hidden `csrf_token` every form of the console carries (templates call it); empty
    under the bearer header, which needs none."""
    return str(g.get("ops_csrf", ""))


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


def check_change(session_id: str, *, csrf: bool) -> None:
    """A change under the cookie: from this site's pages, with the session's CSRF token (the
    RQ dashboard's own scripts post without one: `csrf=False` there, SameSite=Strict and the
    origin check hold)."""
    if not same_origin():
        raise Forbidden(
            "a change under the /ops cookie must come from this site's own pages (Origin / Sec-Fetch-Site)",
            code="cross_site_request",
        )
    if csrf:
        presented = request.form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER) or ""
        if not hmac.compare_digest(presented.encode(), csrf_token(session_id).encode()):
            raise Forbidden("this form is stale or was not made by /ops: reload the page", code="csrf_token_invalid")


def require_admin(*, csrf: bool = True) -> Response | None:
    """Before every operator page: pass, redirect a browser without a session to the login
    form (303), or raise: 403 for a change under the cookie from elsewhere, without the CSRF
    token, or one the user's role may not make (webhooks/people/roles.py); 429 when this
    address used up its tries of the token (a bearer or `?token=` is one,
    webhooks/web/logins.py), else the admin API's 401 (a wrong bearer token) / 503 (no
    ADMIN_TOKEN). A user's request names the user in the audit log (storage/records/audit.py)."""
    presented = bearer(request.headers.get("Authorization", ""))
    if presented and logins.attempt(presented):
        return None  # a header no other site can make a browser send: no origin check needed
    in_address = request.args.get("token") if request.method in SAFE_METHODS else None
    if in_address and logins.attempt(in_address):
        return _swap_token_for_cookie()  # a link made before the login form: the token leaves the address
    session_id = live_session()
    if session_id is not None:
        g.ops_csrf = csrf_token(session_id)
        if request.method not in SAFE_METHODS:
            check_change(session_id, csrf=csrf)
        user = g.get("ops_user")
        if user is not None:
            roles.check(user.role, request.method, request.endpoint)  # the one check of every role
            g.audit_acting = audit.acting(accounts.actor(user))  # audit rows name the user
        return None
    if (
        request.method in SAFE_METHODS
        and "Authorization" not in request.headers
        and services.current().config.admin_token
    ):
        return redirect(url_for("ops.auth.login", next=_this_page()), code=303)
    logins.refuse()  # raises: the JSON 401 / 503 answer
    return None


def set_session_cookie(resp: Response, user: User | None = None) -> Response:
    return _with_cookie(resp, COOKIE, open_session(user), COOKIE_PATH)


def _with_cookie(resp: Response, name: str, session_id: str, path: str) -> Response:
    """`resp` setting a session's cookie (/ops or /portal: one set of rules), never cached."""
    cfg = services.current().config
    resp.set_cookie(
        name,
        session_id,
        max_age=cfg.ops_session_ttl_s,
        path=path,
        httponly=True,
        samesite="Strict",
        secure=request.is_secure or not cfg.ops_insecure_cookie,
    )
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _swap_token_for_cookie() -> Response:
    """`?token=` (the contract's way in before the login form, kept for links made then): 303
    to the same address without it, the session cookie set."""
    resp = set_session_cookie(redirect(_this_page(), code=303))
    resp.headers["Referrer-Policy"] = "no-referrer"  # the address with the token goes nowhere
    return resp


def _this_page() -> str:
    """This page's address to come back to after the login, without a `token=` an old
    bookmark may carry (it is no way in: the token goes nowhere near an address)."""
    query = urlencode([(k, v) for k, v in request.args.items(multi=True) if k != "token"])
    return request.path + ("?" + query if query else "")


def done(_exc: BaseException | None = None) -> None:
    """teardown_request of the app: the request's user stops acting for the audit log."""
    token = g.pop("audit_acting", None)
    if token is not None:
        audit.reset(token)


# The portals (/portal, webhooks/web/portal/): a buyer or publisher user's own session, under a
# cookie of its own scoped to /portal and stored under a prefix of its own, so that an /ops
# session opens no portal page and a portal session no /ops page, whichever cookie carries it.
PORTAL_COOKIE = "floodgate_portal"
PORTAL_PATH = "/portal"
PORTAL_SESSION = "portal:"  # the stored value of a portal session: portal:<id>:<csrf token>


def open_portal_session(user: User) -> str:
    """A new portal session id for a buyer or publisher user, with a CSRF token of its own."""
    cfg = services.current().config
    session_id = secrets.token_urlsafe(32)
    value = f"{PORTAL_SESSION}{user.id}:{secrets.token_hex(32)}"
    services.current().store.redis.set(keys.ops_session(digest(session_id)), value, ex=cfg.ops_session_ttl_s)
    return session_id


def portal_session() -> tuple[str, User, str] | None:
    """The portal cookie's session id, its user (active, of a portal role) and CSRF token;
    None when there is no such live session."""
    session_id = request.cookies.get(PORTAL_COOKIE)
    if not session_id or len(session_id) > 128:
        return None
    stored = cast("str | None", services.current().store.redis.get(keys.ops_session(digest(session_id))))
    if stored is None or not stored.startswith(PORTAL_SESSION):
        return None
    user_id, _, csrf = stored.removeprefix(PORTAL_SESSION).partition(":")
    user = accounts.active(int(user_id)) if user_id.isdigit() else None
    if user is None or accounts.Role(user.role) not in accounts.PORTAL_ROLES:
        return None
    return session_id, user, csrf


def end_portal_session(session_id: str) -> None:
    services.current().store.redis.delete(keys.ops_session(digest(session_id)))


def require_portal(role: accounts.Role) -> Response | None:
    """Before every portal page of `role`'s portal: pass with the user in `g.portal_user` (its
    CSRF token in `g.ops_csrf`, which `form_token` gives the templates), or redirect a browser
    without a portal session to the portal's login form (303). A change must come from this
    site's pages with the session's CSRF token (403 otherwise); a user of the other portal's
    role is 404, as a page that does not exist. The audit log names the user."""
    found = portal_session()
    if found is None:
        if request.method in SAFE_METHODS:
            return redirect(url_for("portal.auth.login"), code=303)
        raise Forbidden("log in on /portal first", code="no_session")
    session_id, user, csrf = found
    if accounts.Role(user.role) is not role:
        raise NotFound("no such page")
    if request.method not in SAFE_METHODS:
        if not same_origin():
            raise Forbidden(
                "a change under the /portal cookie must come from this site's own pages (Origin / Sec-Fetch-Site)",
                code="cross_site_request",
            )
        presented = request.form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER) or ""
        if not hmac.compare_digest(presented.encode(), csrf.encode()):
            raise Forbidden("this form is stale or was not made by /portal: reload the page", code="csrf_token_invalid")
    g.portal_user, g.portal_session, g.ops_csrf = user, session_id, csrf
    g.audit_acting = audit.acting(accounts.actor(user))
    return None


def set_portal_cookie(resp: Response, user: User) -> Response:
    return _with_cookie(resp, PORTAL_COOKIE, open_portal_session(user), PORTAL_PATH)
