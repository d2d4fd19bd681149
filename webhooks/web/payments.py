"""POST /v1/webhooks/<provider>: exactly-once payment webhooks (see DESIGN.md, Payment path).

Reject, verify, dedupe, act, answer. Dedupe and claim are one Redis round trip (gate.py); a
duplicate or in-flight delivery answers without touching the database. A claim held by
another request answers 409 in_flight, never 200: that request may still fail, and a 200
would stop the provider's retries. A refund
or reversal takes the same steps under its own reference and debits (refunds.py); each credit
and debit announces itself to the application through the outbox (outbox.py) when
PAYMENT_EVENTS_URL is set.
"""
from __future__ import annotations

import logging
import time

from flask import Blueprint, Response, g, jsonify, request
from redis.exceptions import RedisClusterException

from webhooks import metrics, services
from webhooks.errors import FloodgateError, InvalidJSON, InvalidPayload, NotConfirmed, NotFound, PaymentNotFound
from webhooks.payments import events, flutterwave, gate, ledger, refunds, rejected, signatures
from webhooks.storage import outbox_queue
from webhooks.storage.redis import REDIS_DOWN

log = logging.getLogger(__name__)

bp = Blueprint("payments", __name__)


@bp.after_request
def _count(resp: Response) -> Response:
    """Count the delivery by provider and answer."""
    provider = (request.view_args or {}).get("provider")
    body = resp.get_json(silent=True) or {}
    status = body.get("status") or (body.get("error") or {}).get("code") or str(resp.status_code)
    metrics.payment_answered(provider if provider in signatures.VERIFIERS else "unknown", status)
    return resp


class _Stopwatch:
    """Per-phase durations, sent as a Server-Timing header (what bench/ reads server-side)."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.laps: list[str] = []

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append(f"{name};dur={(now - self.last) * 1000:.3f}")
        self.last = now

    def header(self) -> str:
        return ", ".join(self.laps + [f"total;dur={(time.perf_counter() - self.start) * 1000:.3f}"])


def _answer(status: str, http_status: int, watch: _Stopwatch) -> Response:
    resp = jsonify({"status": status})
    resp.status_code = http_status
    resp.headers["Server-Timing"] = watch.header()
    return resp


def _secrets(provider: str) -> tuple[str, ...]:
    """The provider's secret, or its old and new ones while it is being rotated."""
    if provider not in signatures.VERIFIERS:
        raise NotFound(f"no payment provider {provider!r}")
    secrets = services.current().config.secrets.get(provider)
    if not secrets:
        raise FloodgateError(f"{provider} webhooks are not configured (secret unset)",
                             status=503, code="provider_not_configured")
    return secrets


def _payment_not_found(exc: PaymentNotFound, watch: _Stopwatch) -> Response:
    """409 for a refund of a payment not in the ledger yet: the provider retries it. The body is
    the in_flight answer's shape and the error shape at once (`status` and `error.code`)."""
    resp = jsonify({"status": exc.code, "error": {"code": exc.code, "message": exc.message}})
    resp.status_code = exc.status
    resp.headers["Server-Timing"] = watch.header()
    return resp


def _announce() -> None:
    """A credit or debit committed its event: wake the worker that delivers it. If Redis is
    down the event still is in the database, and the scheduled sweep starts its delivery."""
    svc = services.current()
    try:
        outbox_queue.signal(svc.settle.redis, svc.queue, g.get("request_id"))
    except REDIS_DOWN as exc:
        log.warning("payment event committed, worker not woken (the sweep will deliver it): %s", exc)


def _confirm(event: events.PaymentEvent, delivery: ledger.Delivery) -> None:
    """FLUTTERWAVE_VERIFY=1: ask Flutterwave whether this payment happened as the webhook says
    (its verif-hash is a static secret that signs nothing). 422 and flagged when it did not;
    503 when Flutterwave cannot be asked, so that it delivers again later."""
    cfg = services.current().config
    if event.provider != "flutterwave" or not cfg.flutterwave_verify:
        return
    try:
        flutterwave.confirm(event, cfg.flutterwave_api_base, cfg.flutterwave_secret_key)
    except NotConfirmed as exc:
        ledger.record_unconfirmed(delivery, event, exc.message)
        raise


def _reject(delivery: ledger.Delivery) -> None:
    """A delivery that failed its signature check: counted, and its metadata pushed to the
    capped Redis list (rejected.py). It touches no database, so a flood of forgeries takes
    no connection from real payments. If Redis is down the 401 stands (the metric counts it)."""
    metrics.payment_rejected(delivery.provider, delivery.length)
    try:
        rejected.record(services.current().store.redis, delivery, g.get("request_id"))
    # RedisClusterException: how a cluster pipeline says that no node answers
    except (*REDIS_DOWN, RedisClusterException) as exc:
        log.warning("%s webhook with an invalid signature not listed, Redis unavailable: %s", delivery.provider, exc)


@bp.post("/v1/webhooks/<provider>")
def receive(provider: str):
    watch = _Stopwatch()
    secrets = _secrets(provider)
    raw = request.get_data(cache=True)
    delivery = ledger.delivery(provider, raw, request.headers)

    try:
        signatures.verify(provider, raw, request.headers, secrets, time.time())
    except signatures.InvalidSignature:
        _reject(delivery)
        raise
    watch.lap("verify")
    try:
        event = events.parse(provider, raw)
    except (InvalidPayload, InvalidJSON) as exc:
        ledger.record(delivery, exc.code, 400)
        raise
    watch.lap("parse")
    refund = isinstance(event, events.RefundEvent)
    if not refund and not event.succeeded:
        ledger.record(delivery, "ignored", 200, event)
        return _answer("ignored", 200, watch)

    svc = services.current()
    cfg, store = svc.config, svc.store
    entry = gate.enter(store, svc.settle, svc.queue, event, delivery, cfg.payment_claim_ttl_ms,
                       g.get("request_id"))
    watch.lap("dedupe")
    if entry.verdict != gate.CLAIMED:  # its audit row is queued: nothing waits for the database
        return _answer(entry.verdict, gate.STATUS[entry.verdict], watch)

    announce = bool(cfg.payment_events_url)
    processed = False
    try:
        # each commits, or raises: nothing kept
        if refund:
            verdict = refunds.debit(event, delivery, announce)
        else:
            _confirm(event, delivery)
            verdict = ledger.credit(event, delivery, announce)
        processed = True
    except PaymentNotFound as exc:
        return _payment_not_found(exc, watch)
    finally:
        gate.finish(store, event, entry.claim, processed)
    watch.lap("ledger")
    if announce and verdict != "duplicate":
        _announce()
    return _answer(verdict, 200, watch)
