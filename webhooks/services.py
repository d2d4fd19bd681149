"""The web process's services: one typed object built by create_app (as workers/context.py
builds a worker's Backends), reached by views and CLI commands through `current()`.

It holds the one Config the process runs with; what needs settings is built from it here
(and built again by `reconfigure`), nothing reads the environment or app.config itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask, current_app
from rq import Queue

from webhooks.config import Config
from webhooks.leads.path.intake import Intake
from webhooks.leads.path.settlement import Journal
from webhooks.leads.rules.catalog import Catalog
from webhooks.payments.webhook import PaymentWebhooks
from webhooks.storage.live.redis import ReplicaWait, Store, make_queue_redis, make_redis
from webhooks.storage.live.settle_queue import queue

EXTENSION = "floodgate"


@dataclass(kw_only=True)
class Services:
    config: Config
    store: Store  # REDIS_URL: caps, leases, claims, breakers, config version, ops sessions
    queue_redis: (
        Store  # RQ_REDIS_URL: the settlement lists and the payment outbox's signals (`store` itself unless set)
    )
    queue: Queue  # RQ's queue on the queue Redis (raw replies: RQ pickles)
    journal: Journal  # what this process queued lately, pushed again if the queue Redis loses it
    catalog: Catalog  # the buyer and publisher config cache
    intake: Intake  # the lead path
    payments: PaymentWebhooks  # the payment webhook path

    @classmethod
    def build(cls, cfg: Config) -> Services:
        """Every client and cache of one web process (connections open lazily)."""
        store = Store(
            make_redis(cfg.redis_url, cfg.redis_max_connections),
            ReplicaWait(cfg.cap_wait_replicas, cfg.cap_wait_timeout_ms),
        )
        same = cfg.queue_redis_url == cfg.redis_url
        queue_redis = store if same else Store(make_redis(cfg.queue_redis_url, cfg.redis_max_connections))
        rq_queue = queue(make_queue_redis(cfg.queue_redis_url))
        journal = Journal(
            queue_redis.redis,
            rq_queue,
            cfg.journal_keep_s,
            claims=store,
            replay_ttl_s=cfg.lead_replay_ttl_s,
            max_bytes=cfg.journal_max_bytes,
        )
        catalog = Catalog(store.redis, cfg.config_check_interval_ms / 1000, cfg.suppression_key)
        return cls(
            config=cfg,
            store=store,
            queue_redis=queue_redis,
            queue=rq_queue,
            journal=journal,
            catalog=catalog,
            intake=Intake.build(cfg, store, queue_redis, journal),
            payments=PaymentWebhooks.build(cfg, store, queue_redis, rq_queue, catalog.billed_wallets),
        )

    def reconfigure(self, cfg: Config) -> None:
        """Run with `cfg` from now on (the clients stay: a test changing a setting)."""
        self.config = cfg
        if cfg.suppression_key != self.catalog.suppression_key:  # the lists are read with the key
            self.catalog.suppression_key = cfg.suppression_key
            self.catalog.invalidate_all()
        self.intake = Intake.build(cfg, self.store, self.queue_redis, self.journal)
        billed = self.catalog.billed_wallets
        self.payments = PaymentWebhooks.build(cfg, self.store, self.queue_redis, self.queue, billed)


def of(app: Flask) -> Services:
    """The services create_app built for `app`."""
    services = app.extensions[EXTENSION]  # Flask keeps its extensions as Any
    assert isinstance(services, Services)
    return services


def current() -> Services:
    """The services of the app handling this request or CLI command."""
    return of(current_app)
