"""The buyer and publisher portals (`/portal`, docs/api.md "Portals"): a buyer or publisher
user, invited by an operator (webhooks/web/people/api.py), logs in on `/portal/login` (auth.py)
and sees and changes only what is its own buyer's (buyer.py) or publisher's (publisher.py).
The session, CSRF and same-origin rules: webhooks/web/sessions.py; every answer carries the
console's headers (no script, no framing, no cache)."""

from __future__ import annotations

from flask import Blueprint, Response, request

from webhooks.web import sessions
from webhooks.web.portal import auth, buyer, publisher

bp = Blueprint("portal", __name__, template_folder="templates")
for routes in (auth, buyer, publisher):
    bp.register_blueprint(routes.bp)

# The console's page policy (webhooks/web/ops/csp.py): no script at all, nothing from elsewhere.
POLICY = (
    "default-src 'none'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; font-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'; script-src 'none'"
)


@bp.after_app_request
def _protect(resp: Response) -> Response:
    if request.path == sessions.PORTAL_PATH or request.path.startswith(sessions.PORTAL_PATH + "/"):
        resp.headers["Content-Security-Policy"] = POLICY
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["X-Frame-Options"] = "DENY"
        resp.headers["Cache-Control"] = "no-store"
        resp.headers["Referrer-Policy"] = "no-referrer"
    return resp
