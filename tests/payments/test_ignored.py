"""An `ignored` answer says why, and GET /v1/admin/webhooks/ignored counts the ignored deliveries
per provider and event type (docs/api.md "Disputes, refunds on every API version"), so that a new
money-moving event type shows up. The app in this process, real Redis and database."""

from __future__ import annotations

import copy

from testkit.payments import STRIPE, deliver, encode, payload
from tests.payments.test_disputes import stripe_dispute


def stripe_event(type_: str) -> bytes:
    body = copy.deepcopy(STRIPE)
    body["type"] = type_
    return encode(body)


def test_ignored_webhook_calls_are_counted_per_provider_type_and_reason(api):
    for _ in range(3):  # a type Floodgate moves no money for, three times
        resp = deliver(api, "stripe", stripe_event("customer.created"))
        assert resp.json() == {"status": "ignored", "reason": "event_type"}
    assert deliver(api, "stripe", stripe_dispute("charge.dispute.created")).json()["reason"] == "dispute_open"
    failed = deliver(api, "paystack", encode(payload("paystack", "ps-f", 5000, success=False)))
    assert failed.json() == {"status": "ignored", "reason": "event_type"}
    assert deliver(api, "paystack", encode(payload("paystack", "ps-ok", 5000))).json()["status"] == "credited"

    every = api.get("/v1/admin/webhooks/ignored")
    assert every.status_code == 200, every.text
    found = [(c["provider"], c["event_type"], c["reason"], c["count"]) for c in every.json()["ignored"]]
    assert found == [
        ("stripe", "customer.created", "event_type", 3),
        ("paystack", "charge.failed", "event_type", 1),
        ("stripe", "charge.dispute.created", "dispute_open", 1),
    ]
    assert every.json()["total"] == 5
    assert all(c["last_received_at"].endswith("Z") for c in every.json()["ignored"])

    stripe_only = api.get("/v1/admin/webhooks/ignored?provider=stripe").json()
    assert {c["provider"] for c in stripe_only["ignored"]} == {"stripe"} and stripe_only["total"] == 4
    later = api.get("/v1/admin/webhooks/ignored?since=2999-01-01T00:00:00Z").json()
    assert (later["ignored"], later["total"]) == ([], 0)


def test_the_ignored_count_refuses_a_bad_query(api):
    for query in ("provider=paypal", "since=yesterday"):
        resp = api.get(f"/v1/admin/webhooks/ignored?{query}")
        assert (resp.status_code, resp.json()["error"]["code"]) == (400, "invalid_query"), query


def test_an_ignored_webhook_call_is_counted_in_the_metric(api):
    deliver(api, "stripe", stripe_event("customer.updated"))
    metrics = api.get("/metrics").text
    line = 'floodgate_payment_ignored_total{event_type="customer.updated",provider="stripe",reason="event_type"} 1.0'
    assert line in metrics
