"""Floodgate: webhook intake for lead routing under caps and exactly-once payment webhooks."""
from __future__ import annotations

from flask import Flask

from . import config as config_mod
from . import logs


def create_app(config: config_mod.Config | None = None) -> Flask:
    """The Flask app: config, Redis, database, per-process caches, blueprints."""
    from . import http
    from .catalog import Catalog
    from .db import close_db, init_db
    from .delivery import Deliverer
    from .routing import Router
    from .settlement import Journal
    from workers.queues import queue
    from .store import make_queue_redis, make_redis

    cfg = config or config_mod.load()
    logs.configure()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes
    app.config["FLOODGATE"] = cfg
    app.json.sort_keys = False

    init_db(cfg.database_url, cfg.db_pool_size)
    app.teardown_appcontext(close_db)
    redis = make_redis(cfg.redis_url, cfg.redis_max_connections, cfg.cap_wait_replicas, cfg.cap_wait_timeout_ms)
    app.extensions["redis"] = redis
    same = cfg.queue_redis_url == cfg.redis_url
    settle_redis = redis if same else make_redis(cfg.queue_redis_url, cfg.redis_max_connections)
    app.extensions["settle_redis"] = settle_redis
    app.extensions["queue"] = queue(make_queue_redis(cfg.queue_redis_url))
    app.extensions["journal"] = Journal(settle_redis, app.extensions["queue"], cfg.journal_keep_s)
    app.extensions["catalog"] = Catalog(redis, cfg.config_check_interval_ms / 1000)
    app.extensions["router"] = Router(redis, settle_redis, Deliverer(cfg.buyer_timeout_ms),
                                      cfg.buyer_timeout_ms, cfg.breaker_failures, cfg.breaker_cooldown_ms)
    http.init_app(app)

    from .admin import bp as admin_bp
    from .leads import bp as leads_bp
    from .ops import bp as ops_bp
    from .payments import bp as payments_bp

    for bp in (ops_bp, admin_bp, leads_bp, payments_bp):
        app.register_blueprint(bp)

    from .cli import init_app as init_cli

    init_cli(app)
    return app
