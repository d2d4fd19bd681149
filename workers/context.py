"""What a job needs, built once per worker process from config.load() (never at import)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from webhooks import config, logs, metrics, outbound
from webhooks.storage.live.redis import Store, make_store
from webhooks.storage.records.db import init_db


@dataclass(frozen=True)
class Backends:
    cfg: config.Config
    store: Store  # caps, leases, breakers
    queue_redis: Store  # RQ_REDIS_URL: the RQ queues and the settlement lists (`store` itself unless set)


@functools.lru_cache(maxsize=1)
def backends() -> Backends:
    cfg = config.load()
    logs.configure(cfg.log_level)
    metrics.init(cfg)
    outbound.configure(cfg.outbound_deny_nets, allow_loopback=cfg.outbound_allow_loopback)
    init_db(cfg.database_url, pool_size=2)
    store = make_store(cfg.redis_url, 8)
    queue_redis = store if cfg.queue_redis_url == cfg.redis_url else make_store(cfg.queue_redis_url, 8)
    return Backends(cfg=cfg, store=store, queue_redis=queue_redis)
