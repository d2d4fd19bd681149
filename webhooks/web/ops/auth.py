"""The admin token for the operator pages, which a browser must be able to open: besides the
`Authorization: Bearer` header of the admin API, `?token=<ADMIN_TOKEN>` is accepted once and
swapped for an HttpOnly, SameSite=Strict cookie scoped to /ops (the page refreshes itself and
the RQ dashboard fetches its data with plain XHRs, neither of which can send a header)."""
from __future__ import annotations

import hmac
from urllib.parse import urlencode

from flask import Response, current_app, redirect, request

from webhooks.web.admin import check_admin_token

COOKIE = "floodgate_ops"
COOKIE_PATH = "/ops"


def _matches(presented: str | None) -> bool:
    token = current_app.config["FLOODGATE"].admin_token
    return bool(presented and token) and hmac.compare_digest(presented.encode(), token.encode())


def require_admin() -> Response | None:
    """before_request of the ops pages: pass, redirect to drop `?token=` from the address
    (setting the cookie), or raise the admin API's 401/503."""
    if _matches(request.args.get("token")):
        query = urlencode([(k, v) for k, v in request.args.items(multi=True) if k != "token"])
        resp = redirect(request.path + ("?" + query if query else ""), code=303)
        resp.set_cookie(COOKIE, request.args["token"], path=COOKIE_PATH, httponly=True,
                        samesite="Strict", secure=request.is_secure)
        return resp
    if _matches(request.cookies.get(COOKIE)):
        return None
    check_admin_token()  # the header, or the JSON 401 / 503 answer
    return None
