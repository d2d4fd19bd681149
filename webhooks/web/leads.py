"""POST /v1/leads: the request handed to the lead path (leads/path/intake.py `Intake.receive`),
its answer sent back and counted; POST /v1/leads/check, the pre-ping (`Intake.check`)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from flask import Blueprint, Response, g, request
from flask.typing import ResponseReturnValue

from webhooks import metrics, services
from webhooks.leads.path.intake import LeadRequest
from webhooks.web.http import json_body, request_id

bp = Blueprint("leads", __name__)


@bp.before_request
def _start_clock() -> None:
    g.lead_clock = time.perf_counter()


@bp.after_request
def _count(resp: Response) -> Response:
    """Count the answer and its latency (in memory: no Redis); a pre-ping is no lead."""
    if request.endpoint == "leads.check_lead":
        return resp
    outcome = "error"
    if resp.status_code == 409:
        outcome = "in_flight"
    elif resp.status_code == 200:
        outcome = g.get("lead_outcome", "error")  # as intake decided it (`LeadAnswer`), not read back out of `resp`
    started = g.get("lead_clock")
    metrics.lead_answered(outcome, None if started is None else time.perf_counter() - started)
    return resp


def _lead_request() -> LeadRequest:
    return LeadRequest(
        authorization=request.headers.get("Authorization", ""),
        body=json_body,
        text=lambda: request.get_data(as_text=True),
        received_at=datetime.now(timezone.utc),
        request_id=request_id(),
    )


@bp.post("/v1/leads")
def post_lead() -> ResponseReturnValue:
    svc = services.current()
    lead_request = _lead_request()
    answer = svc.intake.receive(svc.catalog.snapshot(), lead_request)
    g.lead_outcome = answer.outcome
    return Response(answer.text, mimetype="application/json")


@bp.post("/v1/leads/check")
def check_lead() -> ResponseReturnValue:
    svc = services.current()
    return Response(svc.intake.check(svc.catalog.snapshot(), _lead_request()), mimetype="application/json")
