"""The RQ dashboard (rq-dashboard) at /ops/rq, behind the admin token.

rq-dashboard's templates name their routes absolutely (`rq_dashboard.<view>`), so its blueprint
is registered on the app itself, when the ops blueprint is, and guarded by an app-level
before_request keyed to its name (the blueprint object is the library's, shared by every app).
"""
from __future__ import annotations

import rq_dashboard
from flask import Flask
from rq_dashboard.web import setup_rq_connection

from webhooks.web.ops import bp
from webhooks.web.ops.auth import require_admin

URL_PREFIX = "/ops/rq"


@bp.record_once
def _mount(state) -> None:
    app: Flask = state.app
    app.config.setdefault("RQ_DASHBOARD_REDIS_URL", app.config["FLOODGATE"].queue_redis_url)
    app.config.setdefault("RQ_DASHBOARD_POLL_INTERVAL", 5000)
    app.before_request_funcs.setdefault(rq_dashboard.blueprint.name, []).append(require_admin)
    app.register_blueprint(rq_dashboard.blueprint, url_prefix=URL_PREFIX)
    setup_rq_connection(app)  # a client only; nothing connects until a page is opened
