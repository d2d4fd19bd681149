"""POST /v1/leads: authenticate, validate, claim the lead id, route, answer, hand to the ledger."""
from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

from flask import Blueprint, Response, current_app, g, jsonify, request

from .. import caps, claims, keys, metrics, settlement
from ..delivery import ACCEPTED
from ..errors import Conflict, Forbidden, Unauthorized, Unavailable, ValidationError
from ..http import json_body
from ..publishers import key_hash
from ..routing import candidates
from ..store import REDIS_DOWN
from ..validate import is_id

bp = Blueprint("leads", __name__)
bp.before_request(metrics.start_timer)
bp.after_request(metrics.lead_answered)

CODE = "invalid_lead"
CLAIM_MARGIN_MS = 10_000


def _publisher(snapshot):
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer ") or len(header) > 300:
        raise Unauthorized("missing bearer API key")
    publisher = snapshot.publishers_by_key.get(key_hash(header[7:]))
    if publisher is None:
        raise Unauthorized("unknown API key")
    if not publisher.active:
        raise Forbidden("publisher is inactive", code="publisher_inactive")
    return publisher


def _lead(body) -> tuple[str, dict]:
    if not isinstance(body, dict):
        raise ValidationError(CODE, "body", "must be a JSON object")
    lead = dict(body)
    lead_id = lead.pop("lead_id", None)
    if lead_id is None:
        lead_id = uuid.uuid4().hex
    elif not is_id(lead_id):
        raise ValidationError(CODE, "lead_id", "must match [A-Za-z0-9._-]{1,64}")
    if "state" in lead and not isinstance(lead["state"], str):
        raise ValidationError(CODE, "state", "must be a string")
    return lead_id, lead


@bp.post("/v1/leads")
def post_lead():
    ext = current_app.extensions
    r, router, cfg = ext["redis"], ext["router"], current_app.config["FLOODGATE"]
    received_at = datetime.now(timezone.utc)
    snapshot = ext["catalog"].snapshot()
    publisher = _publisher(snapshot)
    lead_id, lead = _lead(json_body())

    now = datetime.now(timezone.utc)
    buyers = candidates(snapshot.buyers, lead.get("state"), publisher.id, now)
    claim_ttl = CLAIM_MARGIN_MS + max(1, len(buyers)) * (cfg.buyer_timeout_ms + 100)
    claim, held = claims.claim(r, keys.lead_claim(publisher.id, lead_id), claim_ttl,
                               claims.new_token(claims.ROUTING))
    if claim is None:
        if held.startswith(claims.ROUTING):
            raise Conflict("this lead_id is being routed by another request; retry", code="in_flight")
        return jsonify({**json.loads(held), "replayed": True})

    try:
        outcome = router.route(buyers, publisher, lead_id, lead, now)
    except BaseException:
        claims.release(r, claim)
        raise
    if outcome.status == "unsold" and outcome.waiting_for_rebuild:
        claims.release(r, claim)
        raise Unavailable("buyer caps are being rebuilt after a Redis data loss; retry shortly")

    answer = json.dumps({"lead_id": lead_id, "status": outcome.status, "buyer_id": outcome.buyer_id,
                         "price": None if outcome.price is None else f"{outcome.price:.2f}",
                         "attempts": outcome.attempts})
    item = settlement.make_item(publisher, lead_id, outcome, request.get_data(as_text=True),
                                received_at, g.request_id)
    try:
        # One round trip: confirm the lease, remember the answer, queue the settlement.
        pipe = r.pipeline(transaction=False)
        if outcome.lease is not None:
            caps.finish_in(r, pipe, outcome.lease, ACCEPTED, breaker_failures=cfg.breaker_failures,
                           breaker_cooldown_ms=cfg.breaker_cooldown_ms)
        pipe.set(claim.key, answer, ex=cfg.lead_replay_ttl_s)
        if ext["settle_redis"] is not r:
            pipe.execute()
            pipe = None
        ext["journal"].push(item, pipe)
    except REDIS_DOWN:
        # The buyer has the lead: the answer stands, and the ledger gets it the slow way. An
        # unconfirmed lease just expires; its slot stays counted, as the sale is.
        settlement.settle_directly(item)
    return Response(answer, mimetype="application/json")
