"""POST /v1/leads: reject, authenticate, check the lead against its publisher's spec
(leads/quality.py), act (leads/intake.py), answer."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from flask import Blueprint, Response, g, request
from flask.typing import ResponseReturnValue

from webhooks import metrics, services
from webhooks.leads.intake import authenticate, parse_lead, test_flag
from webhooks.leads.publishers import throttle
from webhooks.leads.quality import checked
from webhooks.web.http import json_body

bp = Blueprint("leads", __name__)


@bp.before_request
def _start_clock() -> None:
    g.lead_clock = time.perf_counter()


@bp.after_request
def _count(resp: Response) -> Response:
    """Count the answer and its latency (in memory: no Redis)."""
    outcome = "error"
    if resp.status_code == 409:
        outcome = "in_flight"
    elif resp.status_code == 200:
        body = json.loads(g.get("lead_answer", "{}"))  # the answer as intake wrote it, not read back out of `resp`
        outcome = "replayed" if body.get("replayed") else "test" if body.get("test") else str(body.get("status"))
    started = g.get("lead_clock")
    metrics.lead_answered(outcome, None if started is None else time.perf_counter() - started)
    return resp


@bp.post("/v1/leads")
def post_lead() -> ResponseReturnValue:
    received_at = datetime.now(timezone.utc)
    svc = services.current()
    snapshot = svc.catalog.snapshot()
    publisher = authenticate(snapshot, request.headers.get("Authorization", ""))
    # The publisher's token bucket before the body is even read: a flood costs one round trip.
    throttle(svc.store, publisher, svc.config.publisher_rate_limit)
    lead_id, lead = parse_lead(json_body())
    test = test_flag(lead) or publisher.mode == "test"
    lead, payload = checked(publisher.spec, lead_id, lead, request.get_data(as_text=True))
    answer = g.lead_answer = svc.intake.take(
        snapshot, publisher, lead_id, lead, payload, received_at, g.request_id, test
    )
    return Response(answer, mimetype="application/json")
