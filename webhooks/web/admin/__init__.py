"""Admin API (`/v1/admin/*`): bearer ADMIN_TOKEN, compared in constant time and counted per
client address (webhooks/web/logins.py). Each route module owns its blueprint; this one nests
them under the prefix and the token check, which every nested route passes first."""

from __future__ import annotations

from flask import Blueprint

from webhooks.web import logins
from webhooks.web.admin import buyers, events, leads, lists, payments, publishers, statements, suppression

ROUTES = (buyers, events, leads, lists, payments, publishers, statements, suppression)

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")
bp.before_request(logins.require_bearer)
for routes in ROUTES:
    bp.register_blueprint(routes.bp)
