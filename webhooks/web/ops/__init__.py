"""Operations endpoints: liveness, readiness, metrics, the OpenAPI description, the operator
console under /ops and the RQ dashboard at /ops/rq (both behind the admin token, see auth.py).
Each page module owns its blueprint; this one nests them under the console's token check and
templates, and mounts the dashboard."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import yaml
from flask import Blueprint, Response, jsonify
from flask.typing import ResponseReturnValue

from webhooks import metrics, services
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.payments.providers import payment_lists
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, db
from webhooks.web import sessions
from webhooks.web.ops import auth, buyers, console, csp, events, leads, page, payments, publishers, reports, rq
from webhooks.web.ops.gauges import LiveCollector, OutboxCollector

ROUTES = (auth, buyers, events, leads, page, payments, publishers, reports)

bp = Blueprint("ops", __name__, template_folder="templates")
bp.before_request(auth.guard)  # every console page, whichever module declares it
for routes in ROUTES:
    bp.register_blueprint(routes.bp)


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz() -> ResponseReturnValue:
    down = []
    try:
        services.current().store.redis.ping()
    except REDIS_DOWN:
        down.append("redis")
    try:
        with db.connection_context():
            db.execute_sql("SELECT 1")
    except UNAVAILABLE_ERRORS:
        down.append("database")
    if down:
        body = {"error": {"code": "unavailable", "message": "not ready: " + ", ".join(down) + " down"}, "down": down}
        return jsonify(body), 503
    return jsonify(status="ready", not_reconciled=_not_reconciled())


def _not_reconciled() -> dict[str, str]:
    """The providers whose webhooks are configured but whose payments are not reconciled with
    their API (no API credentials, or no list API at all), and why."""
    cfg = services.current().config
    return {p: why for p, why in payment_lists.unconfigured(cfg).items() if p in cfg.secrets}


@functools.lru_cache(maxsize=1)
def openapi_spec() -> str:
    """webhooks/web/openapi.yaml as JSON text, read once per process."""
    text = resources.files("webhooks.web").joinpath("openapi.yaml").read_text(encoding="utf-8")
    return json.dumps(yaml.safe_load(text), separators=(",", ":"))


@bp.get("/openapi.json")
def openapi() -> ResponseReturnValue:
    return Response(openapi_spec(), mimetype="application/json")


@bp.get("/metrics")
def prometheus_metrics() -> ResponseReturnValue:
    svc = services.current()
    buyer_ids = [b.id for b in _buyers()]
    body, content_type = metrics.scrape(
        LiveCollector(svc.store.redis, svc.queue_redis.redis, svc.queue, buyer_ids), OutboxCollector()
    )
    return Response(body, content_type=content_type)


def _buyers() -> tuple[BuyerRule, ...]:
    """Active buyers from the per-process config cache; none when it cannot be refreshed (the
    scrape still answers, with floodgate_redis_up telling whether Redis could be read)."""
    try:
        return services.current().catalog.snapshot().buyers
    except (*REDIS_DOWN, *UNAVAILABLE_ERRORS):
        return ()


@bp.record_once
def _on_app(state: Any) -> None:  # a BlueprintSetupState
    state.app.teardown_request(sessions.done)
    csp.init_app(state.app)
    console.init_app(state.app)
    rq.init_app(state.app)
