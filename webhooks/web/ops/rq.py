"""The RQ dashboard (rq-dashboard) at /ops/rq, behind the admin token.

rq-dashboard's templates name their routes absolutely (`rq_dashboard.<view>`), so its blueprint
is registered on the app itself, when the ops blueprint is, and guarded by an app-level
before_request keyed to its name (the blueprint object is the library's, shared by every app).
The guard also refuses GET on the requeue-all route (a link or an <img> must not requeue
jobs), and the faults the dashboard lets escape for a bad address (unknown job, instance
number or page) answer 4xx JSON instead of a 500.
"""

from __future__ import annotations

import rq_dashboard
from flask import Flask, request
from flask.typing import ResponseReturnValue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq_dashboard.web import setup_rq_connection

from webhooks import services
from webhooks.errors import FloodgateError
from webhooks.web.http import error
from webhooks.web.sessions import require_admin

URL_PREFIX = "/ops/rq"
REQUEUE_ALL = "rq_dashboard.requeue_all"


def guard() -> ResponseReturnValue | None:
    """before_request of every dashboard route: the admin token (and same origin for a change
    under the cookie), then POST only for requeue-all, which the library also serves on GET."""
    answer = require_admin(csrf=False)  # its own scripts post without the form's token
    if answer is None and request.endpoint == REQUEUE_ALL and request.method != "POST":
        raise FloodgateError("requeue takes POST only", status=405, code="method_not_allowed")
    return answer


def _not_found(exc: Exception) -> ResponseReturnValue:
    return error("not_found", f"no such job, queue or dashboard instance: {exc}", 404)


def _bad_request(exc: Exception) -> ResponseReturnValue:
    return error("bad_request", f"malformed dashboard request: {exc}", 400)


def _conflict(exc: Exception) -> ResponseReturnValue:
    return error("conflict", f"the job cannot do that now: {exc}", 409)


def init_app(app: Flask) -> None:
    """Mount the dashboard on `app` (once, when the ops blueprint is registered)."""
    app.config.setdefault("RQ_DASHBOARD_REDIS_URL", services.of(app).config.queue_redis_url)
    app.config.setdefault("RQ_DASHBOARD_POLL_INTERVAL", 5000)
    app.before_request_funcs.setdefault(rq_dashboard.blueprint.name, []).append(guard)
    # Scoped to the dashboard's routes; registered on the library's blueprint before it is
    # registered (that is when Flask copies them), the same handlers each time.
    for exc, handler in (
        (NoSuchJobError, _not_found),
        (LookupError, _not_found),
        (ValueError, _bad_request),
        (InvalidJobOperation, _conflict),
    ):
        rq_dashboard.blueprint.register_error_handler(exc, handler)
    app.register_blueprint(rq_dashboard.blueprint, url_prefix=URL_PREFIX)
    setup_rq_connection(app)  # a client only; nothing connects until a page is opened
