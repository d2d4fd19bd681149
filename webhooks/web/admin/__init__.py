"""Admin API (`/v1/admin/*`): bearer ADMIN_TOKEN, compared in constant time."""

from __future__ import annotations

import hmac

from flask import Blueprint, request

from webhooks import services
from webhooks.errors import FloodgateError, Unauthorized
from webhooks.validate import bearer

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")


def check_admin_token() -> None:
    """Raise unless the request carries the admin token; also used by the ops pages."""
    token = services.current().config.admin_token
    if not token:
        raise FloodgateError("ADMIN_TOKEN is not set; the admin API is disabled", status=503, code="admin_disabled")
    presented = bearer(request.headers.get("Authorization", ""))
    if not hmac.compare_digest(presented.encode(), token.encode()):
        raise Unauthorized("missing or wrong admin token")


bp.before_request(check_admin_token)

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
