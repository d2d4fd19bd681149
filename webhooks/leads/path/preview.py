"""What a buyer would receive for a sample lead (POST /v1/admin/buyers/<id>/preview): built by
the same code as a real delivery, with header secrets redacted; nothing is sent or reserved.
And a test lead sent to a buyer from its console page (`send_test`): pinged, or posted, marked
`X-Floodgate-Test: 1`, with nothing reserved, sold or written but the audit row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from webhooks.errors import ValidationError
from webhooks.leads.path.intake import parse_lead
from webhooks.leads.path.routing import Offer, Router, idempotency_key
from webhooks.leads.posting.delivery import USER_AGENT
from webhooks.leads.posting.integration import RenderBudgetExceeded
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.logs import redact_secret, redact_url

PREVIEW_PUBLISHER = "preview"
TEST_PUBLISHER = "test"  # the publisher_id a test lead from the console is sent as
REPLY_SHOWN = 2000  # characters of a test lead's reply kept to show
# An obviously fake lead: a reserved e-mail domain, a 555-01xx number (fictional by design).
SAMPLE_LEAD = {
    "first_name": "Test",
    "last_name": "Lead",
    "email": "test.lead@example.com",
    "phone": "+15555550123",
    "state": "TX",
    "zip": "75001",
}


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


@dataclass(frozen=True, kw_only=True)
class TestSent:
    """How a test lead went: pinged (a ping/post buyer) or posted, the HTTP status (0: no whole
    reply), the time taken, the outcome (a post: accepted, rejected, error, timeout, not_sent;
    a ping: bid, no_bid, error, timeout, not_sent), the bid read and the reply's start."""

    sent: str
    lead_id: str
    status: int
    ms: int
    outcome: str
    bid: str | None
    reply: str
    reply_cut: bool

    def audited(self) -> dict[str, Any]:
        """What the audit row keeps: never the reply, which is the buyer's text."""
        return {
            "sent": self.sent,
            "lead_id": self.lead_id,
            "status": self.status,
            "ms": self.ms,
            "outcome": self.outcome,
            "bid": self.bid,
        }


def send_test(router: Router, buyer: BuyerRule, body: Any) -> TestSent:
    """Send `body` (a lead, as a publisher posts it) to `buyer` as a test lead, through the
    router's own client and deadlines: a ping/post buyer is pinged (PING_TIMEOUT_MS) and never
    posted, as a test lead from a publisher is; any other buyer is posted to (BUYER_TIMEOUT_MS)
    as a delivery is, so that its endpoint can be checked. Both carry `X-Floodgate-Test: 1`.
    No cap, circuit, balance or ledger is read or moved."""
    lead_id, lead = parse_lead(body)
    try:
        got = _ping(router, buyer, lead_id, lead) if buyer.ping is not None else _post(router, buyer, lead_id, lead)
    except RenderBudgetExceeded:  # the buyer's template, over its budget for this lead
        got = _Got(0, b"", "not_sent", 0)
    text = got.content.decode("utf-8", "replace")
    return TestSent(
        sent="ping" if buyer.ping is not None else "post",
        lead_id=lead_id,
        status=got.status,
        ms=got.ms,
        outcome=got.outcome,
        bid=got.bid,
        reply=text[:REPLY_SHOWN],
        reply_cut=len(text) > REPLY_SHOWN,
    )


class _Got(NamedTuple):
    status: int
    content: bytes
    outcome: str
    ms: int
    bid: str | None = None


def _ping(router: Router, buyer: BuyerRule, lead_id: str, lead: dict[str, Any]) -> _Got:
    """The ping as routing sends a test lead's (its bid read as routing reads it)."""
    spec = buyer.ping
    assert spec is not None  # a pinger
    context = {"lead": lead, "lead_id": lead_id, "publisher_id": TEST_PUBLISHER, "buyer_id": buyer.id}
    body = spec.body({**context, "price": f"{buyer.price:.2f}"})
    status, content, failure, ms = router.deliverer.ping(spec.url, body, router.ping_timeout_ms / 1000, test=True)
    if failure is not None or not 200 <= status < 300:
        return _Got(status, content, failure or "no_bid", ms)
    bid, _ = spec.read_bid(content)
    if bid is None or bid > router.max_bid:
        return _Got(status, content, "no_bid", ms)
    return _Got(status, content, "bid", ms, f"{bid:.2f}")


def _post(router: Router, buyer: BuyerRule, lead_id: str, lead: dict[str, Any]) -> _Got:
    """The post as a delivery's, at the buyer's price, judged by its accept rule."""
    body = Offer(buyer, buyer.price).body(lead_id, TEST_PUBLISHER, lead, json.dumps(lead, separators=(",", ":")))
    key = idempotency_key(TEST_PUBLISHER, lead_id, buyer.id)
    status, content, outcome, ms = router.deliverer.test_post(buyer.endpoint_url, body, key, buyer.post)
    return _Got(status, content, str(outcome), ms)
