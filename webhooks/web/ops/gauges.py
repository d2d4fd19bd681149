"""Gauges read at scrape time from Redis (breakers, queue depths, pending settlements) and from the
database (payment events not yet delivered), added to every process's samples by GET /metrics."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from rq import Queue
from rq.registry import FailedJobRegistry

from webhooks.caps.breaker import BREAKER_STATES, breakers
from webhooks.payments import outbox
from webhooks.storage import keys
from webhooks.storage.batch import Client
from webhooks.storage.db import UNAVAILABLE_ERRORS
from webhooks.storage.redis import REDIS_DOWN

log = logging.getLogger(__name__)


class LiveCollector:
    """Gauges read from Redis at scrape time: breaker state per buyer, RQ queue depth and
    failed jobs, pending settlements. A Redis that does not answer is reported, not raised."""

    def __init__(self, redis: Client, settle_redis: Client, queue: Queue, buyer_ids: list[str]):
        self.redis, self.settle_redis, self.queue, self.buyer_ids = redis, settle_redis, queue, buyer_ids

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("floodgate_redis_up", "1 when this scrape could read Redis")
        state = GaugeMetricFamily(
            "floodgate_breaker_state",
            "Circuit breaker of a buyer: 0 closed, 1 open, 2 half-open (the next lead is a probe)",
            labels=["buyer_id"],
        )
        failures = GaugeMetricFamily(
            "floodgate_breaker_failures",
            "Consecutive failed deliveries counted by a buyer's breaker",
            labels=["buyer_id"],
        )
        queued = GaugeMetricFamily("floodgate_rq_queue_depth", "Jobs waiting in an RQ queue", labels=["queue"])
        failed = GaugeMetricFamily(
            "floodgate_rq_failed_jobs", "Jobs in an RQ queue's failed registry (out of retries)", labels=["queue"]
        )
        pending = GaugeMetricFamily("floodgate_settlements_pending", "Routed leads waiting to be written to the ledger")
        try:
            for buyer_id, breaker in breakers(self.redis, self.buyer_ids).items():
                state.add_metric([buyer_id], BREAKER_STATES.index(breaker.state))
                failures.add_metric([buyer_id], breaker.failures)
            queued.add_metric([self.queue.name], self.queue.count)
            failed.add_metric([self.queue.name], FailedJobRegistry(queue=self.queue).count)
            pending.add_metric([], self.settle_redis.llen(keys.SETTLE_PENDING))
        except REDIS_DOWN as exc:
            log.warning("metrics: Redis unavailable at scrape: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield from (up, state, failures, queued, failed, pending)


class OutboxCollector:
    """Payment events not yet delivered to PAYMENT_EVENTS_URL, by status, from the database (the
    outbox is there, not in Redis). A database that does not answer leaves the gauge out."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "floodgate_payment_events",
            "Payment events not yet delivered to "
            "PAYMENT_EVENTS_URL, by status (pending: being retried or waiting for an "
            "earlier one of the same customer; failed: given up, see `events retry`)",
            labels=["status"],
        )
        try:
            counts = outbox.counts()
        except UNAVAILABLE_ERRORS as exc:
            log.warning("metrics: database unavailable at scrape: %s", exc)
            return
        for status, n in counts.items():
            gauge.add_metric([status], n)
        yield gauge
