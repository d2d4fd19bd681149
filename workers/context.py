"""What a job needs, built once per worker process from the environment (never at import)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from webhooks import config, logs
from webhooks.db import init_db
from webhooks.store import make_redis


@dataclass(frozen=True)
class Backends:
    cfg: config.Config
    redis: object  # caps, leases, breakers
    settle_redis: object  # the settlement lists (same server as the RQ queue)


@functools.lru_cache(maxsize=1)
def backends() -> Backends:
    cfg = config.load()
    logs.configure()
    init_db(cfg.database_url, pool_size=2)
    redis = make_redis(cfg.redis_url, 8)
    settle = redis if cfg.queue_redis_url == cfg.redis_url else make_redis(cfg.queue_redis_url, 8)
    return Backends(cfg, redis, settle)
