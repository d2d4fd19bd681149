"""Admin API (`/v1/admin/*`): bearer ADMIN_TOKEN, compared in constant time and counted per
client address (webhooks/web/logins.py)."""

from __future__ import annotations

from flask import Blueprint

from webhooks.web import logins

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")
bp.before_request(logins.require_bearer)

from webhooks.web.admin import (  # noqa: E402,F401  (routes)
    buyers,
    events,
    leads,
    lists,
    payments,
    publishers,
    statements,
    suppression,
)
