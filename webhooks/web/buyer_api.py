"""The buyer API (`/v1/buyer/*`, docs/buyers.md "The buyer API"): a buyer, by its own API key,
lists its sales, returns them under its policy and sends feedback on them. Every route passes the key check first:
401 without a key of a live buyer, each wrong key one of the client address' tries (counted
as the admin token's are: web/logins.py). Nothing here reaches another buyer's sale: a lead
not sold to the caller is 404, the same answer as a lead that does not exist."""

from __future__ import annotations

from flask import Blueprint, g, jsonify, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import Unauthorized, ValidationError
from webhooks.formats.validate import bearer, is_id
from webhooks.leads.accounting import buyer_sales, feedback, returns
from webhooks.leads.rules import buyer_keys
from webhooks.storage.live import keys
from webhooks.web import listing, logins
from webhooks.web.http import json_body

bp = Blueprint("buyer_api", __name__, url_prefix="/v1/buyer")

CODE = "invalid_return"
RETURN_FIELDS = ("lead_id", "publisher_id", "reason")


@bp.before_request
def _authenticate() -> None:
    """The caller's buyer id in `g.buyer_id`, from `Authorization: Bearer <buyer key>`."""
    presented = bearer(request.headers.get("Authorization", ""))
    if not presented:
        raise Unauthorized("missing buyer API key: send Authorization: Bearer bk_...")
    counter = keys.buyer_key_failures(logins.address_digest())
    buyer = logins.tried(counter, lambda: buyer_keys.holder(presented), "buyer API keys")
    if buyer is None:
        raise Unauthorized("unknown buyer API key (a new key replaces the old one)")
    if not buyer.active or buyer.deleted_at is not None:
        raise Unauthorized("this API key's buyer is inactive")
    g.buyer_id = buyer.id


@bp.get("/leads")
def list_leads() -> ResponseReturnValue:
    """The caller's sales, newest first: `?status=`, `?since=`, `?limit=`, `?cursor=`."""
    page = listing.sale_page(g.buyer_id)
    return jsonify({"items": page.items, "next_cursor": page.next_cursor})


@bp.post("/returns")
def return_lead() -> ResponseReturnValue:
    """Return the caller's sale of a lead under its policy: 200 with the sale after it, or 202
    {"return_id", "status": "return_pending"} when its returns are reviewed. Every check of the
    body's shape comes before the sale is looked up, so no 400 tells whose a lead is."""
    body = json_body()
    if not isinstance(body, dict) or not set(body) <= set(RETURN_FIELDS):
        raise ValidationError(CODE, "body", 'must be an object {"lead_id", "publisher_id", "reason"}')
    for name in ("lead_id", "publisher_id"):
        if not is_id(body.get(name)):
            raise ValidationError(CODE, name, "is required: an id of 1-64 characters A-Z a-z 0-9 . _ -")
    reason = body.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > returns.MAX_REASON):
        raise ValidationError(CODE, "reason", f"must be a string of at most {returns.MAX_REASON} characters")
    svc = services.current()
    done = buyer_sales.return_own(
        svc.store,
        queue_redis=svc.queue_redis,
        queue=svc.queue,
        buyer_id=g.buyer_id,
        publisher_id=body["publisher_id"],
        lead_id=body["lead_id"],
        reason=reason,
    )
    return jsonify(done.record), 202 if done.pending else 200


@bp.post("/feedback")
def send_feedback() -> ResponseReturnValue:
    """Feedback on the caller's sale of a lead, stored once under the buyer's own `id`: 200 with
    the feedback as stored (the same `id` again: the one stored before; another body under it:
    409 feedback_conflict). The body's shape is checked before the sale is looked up."""
    given = feedback.parse(json_body())
    sale = buyer_sales.own_sale(g.buyer_id, given.publisher_id, given.lead_id)
    return jsonify(feedback.record(sale, given))
