"""Prometheus metrics, in prometheus_client's multiprocess mode: every gunicorn worker and RQ
worker writes its samples to files in one directory, and a scrape of any web worker sums them.

The directory must be chosen before prometheus_client is imported in a process, so this module
sets PROMETHEUS_MULTIPROC_DIR (default `var/prometheus` of the checkout, shared by `web`,
`worker` and the CLI) before importing it. Call sites use the one-line functions below; the
lead path pays a few in-memory increments, never a Redis round trip. Gauges that mirror Redis
(breakers, queue depths) are read at scrape time by `LiveCollector`. `start_timer`,
`lead_answered` and `payment_answered` are Flask request hooks of the leads and payments
blueprints; everything else runs anywhere (web, RQ jobs, CLI).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent


def multiproc_dir() -> str:
    """PROMETHEUS_MULTIPROC_DIR, set to the default if unset, and created."""
    path = os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(ROOT / "var" / "prometheus"))
    os.makedirs(path, exist_ok=True)
    return path


multiproc_dir()

from flask import Response, g, request  # noqa: E402
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,  # noqa: E402
                               Histogram, generate_latest, multiprocess)
from prometheus_client.core import GaugeMetricFamily  # noqa: E402
from rq.registry import FailedJobRegistry  # noqa: E402

from . import keys  # noqa: E402
from .signatures import VERIFIERS  # noqa: E402
from .store import REDIS_DOWN  # noqa: E402

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0)

LEADS = Counter("floodgate_leads_total", "Answers to POST /v1/leads by outcome "
                "(sold, unsold, replayed, in_flight, error)", ["outcome"])
LEAD_SECONDS = Histogram("floodgate_publisher_response_seconds",
                         "Time to answer POST /v1/leads, by outcome", ["outcome"], buckets=LATENCY_BUCKETS)
ATTEMPTS = Counter("floodgate_buyer_attempts_total", "Offers of a lead to a buyer by outcome "
                   "(accepted, rejected, timeout, error, circuit_open)", ["buyer_id", "outcome"])
DELIVERY_SECONDS = Histogram("floodgate_buyer_delivery_seconds", "Duration of one delivery to a buyer",
                             ["buyer_id"], buckets=LATENCY_BUCKETS)
CAP_REFUSALS = Counter("floodgate_cap_refusals_total", "Buyers skipped because a cap was full",
                       ["buyer_id", "cap"])
PAYMENTS = Counter("floodgate_payment_deliveries_total", "Payment webhook deliveries by provider "
                   "and answer (credited, duplicate, ignored, in_flight, or the error code)",
                   ["provider", "status"])
DRIFT = Gauge("floodgate_cap_drift", "Sold + in flight minus the Redis counter, per buyer and cap, "
              "as found by the last reconciliation (0: no drift)", ["buyer_id", "cap"],
              multiprocess_mode="mostrecent")
RECONCILED_AT = Gauge("floodgate_reconcile_last_run_timestamp_seconds",
                      "When the last reconciliation finished", multiprocess_mode="mostrecent")

def attempt(buyer_id: str, outcome: str, ms: int | None = None) -> None:
    """One offer to a buyer; `ms` is the delivery time (None when no call was made)."""
    ATTEMPTS.labels(buyer_id, outcome).inc()
    if ms is not None:
        DELIVERY_SECONDS.labels(buyer_id).observe(ms / 1000)


def cap_refused(buyer_id: str, cap: str) -> None:
    """A reservation refused because `cap` of the buyer is full."""
    CAP_REFUSALS.labels(buyer_id, cap).inc()


def drift(buyer_id: str, cap: str, amount: int) -> None:
    """What reconciliation found: sold + in flight minus the counter (0 when they agree)."""
    DRIFT.labels(buyer_id, cap).set(amount)


def reconciled() -> None:
    """A reconciliation of every buyer finished now."""
    RECONCILED_AT.set(time.time())


def start_timer() -> None:
    """before_request of the leads blueprint: when the answer clock starts."""
    g.metrics_started = time.perf_counter()


def lead_answered(resp: Response) -> Response:
    """after_request of the leads blueprint: count the answer and its latency (no Redis)."""
    outcome = "error"
    if resp.status_code == 409:
        outcome = "in_flight"
    elif resp.status_code == 200:
        body = resp.get_json(silent=True) or {}
        outcome = "replayed" if body.get("replayed") else str(body.get("status"))
    LEADS.labels(outcome).inc()
    started = g.get("metrics_started")
    if started is not None:
        LEAD_SECONDS.labels(outcome).observe(time.perf_counter() - started)
    return resp


def payment_answered(resp: Response) -> Response:
    """after_request of the payments blueprint: count the delivery by provider and answer."""
    provider = (request.view_args or {}).get("provider")
    body = resp.get_json(silent=True) or {}
    status = body.get("status") or (body.get("error") or {}).get("code") or str(resp.status_code)
    PAYMENTS.labels(provider if provider in VERIFIERS else "unknown", status).inc()
    return resp


class LiveCollector:
    """Gauges read from Redis at scrape time: breaker state per buyer, RQ queue depth and
    failed jobs, pending settlements. A Redis that does not answer is reported, not raised."""

    def __init__(self, redis, settle_redis, queue, buyer_ids: list[str]):
        self.redis, self.settle_redis, self.queue, self.buyer_ids = redis, settle_redis, queue, buyer_ids

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("floodgate_redis_up", "1 when this scrape could read Redis")
        state = GaugeMetricFamily("floodgate_breaker_state", "Circuit breaker of a buyer: 0 closed, "
                                  "1 open, 2 half-open (the next lead is a probe)", labels=["buyer_id"])
        failures = GaugeMetricFamily("floodgate_breaker_failures", "Consecutive failed deliveries "
                                     "counted by a buyer's breaker", labels=["buyer_id"])
        queued = GaugeMetricFamily("floodgate_rq_queue_depth", "Jobs waiting in an RQ queue",
                                   labels=["queue"])
        failed = GaugeMetricFamily("floodgate_rq_failed_jobs", "Jobs in an RQ queue's failed "
                                   "registry (out of retries)", labels=["queue"])
        pending = GaugeMetricFamily("floodgate_settlements_pending",
                                    "Routed leads waiting to be written to the ledger")
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


BREAKER_STATES = ("closed", "open", "half_open")


@dataclass(frozen=True)
class Breaker:
    state: str  # closed | open | half_open (open_until passed: the next lead is a probe)
    failures: int
    open_until_ms: int


def breakers(r, buyer_ids: list[str]) -> dict[str, Breaker]:
    """The circuit breaker of each buyer (lua/reserve_lease.lua), read in one round trip."""
    pipe = r.pipeline(transaction=False)
    for buyer_id in buyer_ids:
        pipe.hmget(keys.breaker(buyer_id), "open_until", "failures")
    now_ms = time.time() * 1000
    out = {}
    for buyer_id, (open_until, failures) in zip(buyer_ids, pipe.execute()):
        until = int(open_until or 0)
        state = "closed" if until == 0 else "open" if now_ms < until else "half_open"
        out[buyer_id] = Breaker(state, int(failures or 0), until)
    return out


def scrape(live: LiveCollector) -> Response:
    """The /metrics answer: every process's samples plus the live gauges, in text format."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(live)
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def remove_stale_files() -> None:
    """At gunicorn start: drop the sample files of processes that no longer exist (a previous
    run), keeping those of live ones (an RQ worker running meanwhile). Files end in _<pid>.db."""
    path = Path(multiproc_dir())
    for f in path.glob("*.db"):
        pid = f.stem.rsplit("_", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            f.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, as another user's
    return True


def mark_process_dead(pid: int) -> None:
    """gunicorn child_exit: a dead worker's live gauges stop counting (its counters stay)."""
    multiprocess.mark_process_dead(pid)
