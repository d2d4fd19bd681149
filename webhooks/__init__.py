"""Floodgate: webhook intake for lead routing under caps and exactly-once payment webhooks."""
from __future__ import annotations

from flask import Flask

from webhooks import config as config_mod
from webhooks import logs, metrics


def create_app(config: config_mod.Config | None = None) -> Flask:
    """The Flask app: config, Redis, database, per-process caches, blueprints."""
    from webhooks.leads.catalog import Catalog
    from webhooks.leads.intake import Intake
    from webhooks.leads.settlement import Journal
    from webhooks.storage.db import close_db, init_db
    from webhooks.storage.redis import ReplicaWait, Store, make_queue_redis, make_redis
    from webhooks.storage.settle_queue import queue
    from webhooks.web import http

    cfg = config or config_mod.load()
    logs.configure(cfg.log_level)
    metrics.init(cfg)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes
    app.config["FLOODGATE"] = cfg
    app.json.sort_keys = False

    init_db(cfg.database_url, cfg.db_pool_size)
    app.teardown_appcontext(close_db)
    store = Store(make_redis(cfg.redis_url, cfg.redis_max_connections),
                  ReplicaWait(cfg.cap_wait_replicas, cfg.cap_wait_timeout_ms))
    same = cfg.queue_redis_url == cfg.redis_url
    settle = store if same else Store(make_redis(cfg.queue_redis_url, cfg.redis_max_connections))
    redis, settle_redis = store.redis, settle.redis
    app.extensions.update(store=store, redis=redis, settle=settle, settle_redis=settle_redis)
    app.extensions["queue"] = queue(make_queue_redis(cfg.queue_redis_url))
    app.extensions["journal"] = Journal(settle_redis, app.extensions["queue"], cfg.journal_keep_s,
                                        claims=store, replay_ttl_s=cfg.lead_replay_ttl_s,
                                        max_bytes=cfg.journal_max_bytes)
    app.extensions["catalog"] = Catalog(redis, cfg.config_check_interval_ms / 1000)
    app.extensions["intake"] = Intake.build(cfg, store, settle, app.extensions["journal"])
    http.init_app(app)

    from webhooks.web.admin import bp as admin_bp
    from webhooks.web.leads import bp as leads_bp
    from webhooks.web.ops import bp as ops_bp
    from webhooks.web.payments import bp as payments_bp

    for bp in (ops_bp, admin_bp, leads_bp, payments_bp):
        app.register_blueprint(bp)

    from webhooks.cli import init_app as init_cli

    init_cli(app)
    return app
