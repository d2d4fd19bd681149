"""POST /v1/webhooks/<provider>: exactly-once payment webhooks (docs/payments.md "Flow").

Reject, verify, dedupe, act, answer: the view rejects an unknown or unconfigured provider
before it reads the body, and hands the rest to webhooks/payments/webhook.py, whose Answer
it sends back with its Server-Timing. Errors (401 invalid_signature, 400, 422, 503...) are
raised there and rendered as the JSON error shape by web/http.py.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import cast

from flask import Blueprint, Response, g, jsonify, request

from webhooks import metrics, services
from webhooks.payments.providers import signatures
from webhooks.web.http import request_id

bp = Blueprint("payments", __name__)


@bp.after_request
def _count(resp: Response) -> Response:
    """Count the webhook by provider and answer."""
    provider = (request.view_args or {}).get("provider")
    status = g.get("payment_status")  # set by the view; an error's code is read from its body
    if status is None:
        body = resp.get_json(silent=True) or {}
        status = body.get("status") or (body.get("error") or {}).get("code") or str(resp.status_code)
    metrics.payment_answered(provider if provider in signatures.VERIFIERS else "unknown", status)
    return resp


@bp.post("/v1/webhooks/<provider>")
def receive(provider: str) -> Response:
    payments = services.current().payments
    payments.secrets_of(provider)  # reject: 404 or 503, the body not even read
    headers = cast("Mapping[str, str]", request.headers)  # Headers: get (any case), items, []
    answer = payments.receive(provider, request.get_data(cache=True), headers, request_id(), time.time())
    body = answer.body()
    g.payment_status = body["status"]
    resp = jsonify(body)
    resp.status_code = answer.http_status
    resp.headers.update(answer.headers)
    return resp
