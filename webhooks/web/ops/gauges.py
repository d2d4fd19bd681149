"""Gauges read at scrape time from Redis (breakers, queue depths, pending settlements) and from the
database (event dispatches not yet made, endpoints disabled), added to every process's samples by GET /metrics."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from rq import Queue
from rq.registry import FailedJobRegistry

from webhooks.caps.breaker import BREAKER_STATES, breakers
from webhooks.events import endpoints
from webhooks.events import log as events_log
from webhooks.storage.live import keys
from webhooks.storage.live.batch import Client
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.records.db import UNAVAILABLE_ERRORS

log = logging.getLogger(__name__)


class LiveCollector:
    """Gauges read from Redis at scrape time: breaker state per buyer, RQ queue depth and
    failed jobs, pending settlements. A Redis that does not answer is reported, not raised."""

    def __init__(self, redis: Client, queue_redis: Client, queue: Queue, buyer_ids: list[str]):
        self.redis, self.queue_redis, self.queue, self.buyer_ids = redis, queue_redis, queue, buyer_ids

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("floodgate_redis_up", "1 when this scrape could read Redis")
        state = GaugeMetricFamily(
            "floodgate_breaker_state",
            "A buyer's circuit for every publisher: 0 closed, 1 open, 2 half-open (the next lead is a probe)",
            labels=["buyer_id"],
        )
        failures = GaugeMetricFamily(
            "floodgate_breaker_failures",
            "Connection errors and timeouts in a row counted by a buyer's circuit for every publisher",
            labels=["buyer_id"],
        )
        publishers_open = GaugeMetricFamily(
            "floodgate_breaker_publishers_open",
            "Publishers whose leads skip a buyer: its circuits for single publishers that are open",
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
                publishers_open.add_metric([buyer_id], len(breaker.of("open")))
            queued.add_metric([self.queue.name], self.queue.count)
            failed.add_metric([self.queue.name], FailedJobRegistry(queue=self.queue).count)
            pending.add_metric([], self.queue_redis.llen(keys.SETTLE_PENDING))
        except REDIS_DOWN as exc:
            log.warning("metrics: Redis unavailable at scrape: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield from (up, state, failures, publishers_open, queued, failed, pending)


class OutboxCollector:
    """The events outbox, from the database (it is there, not in Redis): per endpoint, its
    dispatches not yet made and whether it is disabled; PAYMENT_EVENTS_URL's backlog under its
    own name as well. A database that does not answer leaves the gauges out."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        payment = GaugeMetricFamily(
            "floodgate_payment_events",
            "Payment events not yet delivered to PAYMENT_EVENTS_URL, by status (pending: being "
            "retried or waiting for an earlier one of the same customer; failed: given up, see "
            "`events retry`)",
            labels=["status"],
        )
        backlog = GaugeMetricFamily(
            "floodgate_event_deliveries",
            "Event dispatches not yet made, by endpoint and status (pending, failed: given up)",
            labels=["endpoint", "status"],
        )
        disabled = GaugeMetricFamily(
            "floodgate_event_endpoint_disabled",
            "1 while an endpoint is disabled (reason: paused by an operator, or failing for "
            "EVENT_ENDPOINT_DISABLE_AFTER_S); its events are kept",
            labels=["endpoint", "reason"],
        )
        try:
            per_endpoint = events_log.backlog()
            rows = endpoints.listing()
        except UNAVAILABLE_ERRORS as exc:
            log.warning("metrics: database unavailable at scrape: %s", exc)
            return
        managed = per_endpoint.get(endpoints.MANAGED_ID, {"pending": 0, "failed": 0})
        for status, n in managed.items():
            payment.add_metric([status], n)
        for row in rows:
            counts = per_endpoint.get(row.id, {"pending": 0, "failed": 0})
            for status, n in counts.items():
                backlog.add_metric([row.id, status], n)
            disabled.add_metric([row.id, row.disabled_reason or ""], 0 if row.enabled else 1)
        yield from (payment, backlog, disabled)
