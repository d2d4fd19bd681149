"""What a buyer would receive for a sample lead (POST /v1/admin/buyers/<id>/preview): built by
the same code as a real delivery, with header secrets redacted; nothing is sent or reserved."""

from __future__ import annotations

import json
from typing import Any

from webhooks.errors import ValidationError
from webhooks.leads.path.intake import parse_lead
from webhooks.leads.path.routing import Offer, idempotency_key
from webhooks.leads.posting.delivery import USER_AGENT
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.logs import redact_secret, redact_url

PREVIEW_PUBLISHER = "preview"


def request_for(buyer: BuyerRule, body: Any) -> dict[str, Any]:
    """{"method", "url", "headers", "body"} of the post of `body` (a lead, plus an optional
    "ping" reply for a ping/post buyer, whose bid then prices the lead)."""
    if not isinstance(body, dict):
        raise ValidationError("invalid_lead", "body", 'must be a JSON object: a lead, and optionally "ping"')
    lead_body = dict(body)
    ping_reply = lead_body.pop("ping", None)
    lead_id, lead = parse_lead(lead_body)
    offer = Offer(buyer, buyer.price, None, ping_reply)
    if buyer.ping is not None and ping_reply is not None:
        bid, _ = buyer.ping.read_bid(json.dumps(ping_reply).encode())
        if bid is None:
            raise ValidationError("invalid_lead", "ping", "holds no usable bid for this buyer (bid, min_bid)")
        offer = Offer(buyer, bid, bid, ping_reply)
    sent = offer.body(lead_id, PREVIEW_PUBLISHER, lead, json.dumps(lead, separators=(",", ":")))
    headers = {
        "Content-Type": buyer.post.content_type,
        "Idempotency-Key": idempotency_key(PREVIEW_PUBLISHER, lead_id, buyer.id),
        "User-Agent": USER_AGENT,
        **{name: redact_secret(value) for name, value in buyer.post.headers},
    }
    return {
        "method": buyer.post.method,
        "url": redact_url(buyer.endpoint_url),
        "headers": headers,
        "body": sent.decode("utf-8", "replace"),
        "price": f"{offer.price:.2f}",
    }
