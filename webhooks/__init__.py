"""Floodgate: webhook intake for lead routing under caps and exactly-once payment webhooks."""

from __future__ import annotations

from flask import Flask

from webhooks import config as config_mod
from webhooks import logs, metrics


def create_app(config: config_mod.Config | None = None) -> Flask:
    """The Flask app: config, Redis, database, per-process caches, blueprints."""
    from webhooks import outbound, services
    from webhooks.storage.records.db import close_db, init_db
    from webhooks.web import http

    cfg = config or config_mod.load()
    logs.configure(cfg.log_level)
    metrics.init(cfg)
    outbound.configure(cfg.outbound_deny_nets, allow_loopback=cfg.outbound_allow_loopback)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]  # Flask's DefaultJSONProvider has it

    init_db(cfg.database_url, cfg.db_pool_size)
    app.teardown_appcontext(close_db)
    app.extensions[services.EXTENSION] = services.Services.build(cfg)
    http.init_app(app)

    from webhooks.web.admin import bp as admin_bp
    from webhooks.web.buyer_api import bp as buyer_bp
    from webhooks.web.leads import bp as leads_bp
    from webhooks.web.ops import bp as ops_bp
    from webhooks.web.payments import bp as payments_bp
    from webhooks.web.people import api_bp as users_api_bp
    from webhooks.web.people import bp as people_bp
    from webhooks.web.portal import bp as portal_bp

    for bp in (ops_bp, people_bp, admin_bp, users_api_bp, leads_bp, payments_bp, buyer_bp, portal_bp):
        app.register_blueprint(bp)

    from webhooks.cli import init_app as init_cli

    init_cli(app)
    return app
