"""Admin routes of the lead ledger: read a lead, return a lead."""

from __future__ import annotations

from flask import jsonify, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import NotFound, ValidationError
from webhooks.leads import returns
from webhooks.leads.ledger import lead_record
from webhooks.validate import is_id
from webhooks.web.admin import bp
from webhooks.web.http import json_body


def _publisher_id() -> str | None:
    publisher_id = request.args.get("publisher_id")
    if publisher_id is not None and not is_id(publisher_id):
        raise NotFound("no such lead")
    return publisher_id


@bp.get("/leads/<id:lead_id>")
def get_lead(lead_id: str) -> ResponseReturnValue:
    return jsonify(lead_record(returns.find(lead_id, _publisher_id())))


@bp.post("/leads/<id:lead_id>/return")
def return_lead(lead_id: str) -> ResponseReturnValue:
    body = json_body() if request.get_data(cache=True) else {}
    if not isinstance(body, dict) or set(body) - {"reason"}:
        raise ValidationError("invalid_return", "body", 'must be an object {"reason": "..."}')
    reason = body.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > returns.MAX_REASON):
        raise ValidationError(
            "invalid_return", "reason", f"must be a string of at most {returns.MAX_REASON} characters"
        )
    return jsonify(returns.return_lead(services.current().store, lead_id, _publisher_id(), reason))
