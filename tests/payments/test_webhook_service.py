"""webhooks/payments/webhook.py driven directly, with no Flask request: the Answer (status,
HTTP status, Server-Timing) of a forged, an ignored, a credited, a duplicate, an in-flight and
an early refund webhook, against the run's real Redis and database."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from requests.structures import CaseInsensitiveDict
from rq import Queue

from testkit.payments import balance, counts, encode, payload, refund_payload, signed_headers, verdicts
from testkit.servers import RedisServer
from webhooks import services
from webhooks.errors import FloodgateError, InvalidPayload, NotFound
from webhooks.payments import gate, ledger, rejected
from webhooks.payments.providers import notifications
from webhooks.payments.providers.signatures import InvalidSignature
from webhooks.payments.states import Verdict
from webhooks.payments.webhook import PaymentWebhooks
from webhooks.storage.live import keys
from webhooks.storage.live.redis import Store
from webhooks.storage.records.db import db


def build(app, **settings) -> PaymentWebhooks:
    """The payment path of the in-process app's services, with some Config fields changed."""
    svc = services.of(app)
    return PaymentWebhooks.build(dataclasses.replace(svc.config, **settings), svc.store, svc.queue_redis, svc.queue)


@pytest.fixture
def hooks(app, redis_server, database_url) -> PaymentWebhooks:
    return build(app)


def receive(
    hooks: PaymentWebhooks, provider: str, raw: bytes, headers: dict | None = None, request_id: str = "req-unit-1"
):
    """One webhook as the view passes it: the headers case-insensitive, as Flask's are."""
    sent = CaseInsensitiveDict(signed_headers(provider, raw) if headers is None else headers)
    with db.connection_context():
        return hooks.receive(provider, raw, sent, request_id, time.time())


def laps(answer) -> list[str]:
    return [part.split(";")[0] for part in answer.headers["Server-Timing"].split(", ")]


def test_a_forged_webhook_raises_401_and_is_listed_in_redis_only(hooks):
    raw = encode(payload("paystack", "unit-forged", 5000))
    with pytest.raises(InvalidSignature) as caught:
        receive(hooks, "paystack", raw, headers={"x-paystack-signature": "0" * 128}, request_id="req-forger")
    assert (caught.value.status, caught.value.code) == (401, "invalid_signature")
    listed = rejected.listing(hooks.store.redis)
    assert [(e.provider, e.body_length, e.request_id) for e in listed.entries] == [("paystack", len(raw), "req-forger")]
    assert counts() == {"payments": 0, "wallets": 0, "deliveries": 0}


def test_an_ignored_event_answers_ignored_and_is_recorded(hooks):
    answer = receive(hooks, "paystack", encode(payload("paystack", "unit-failed", 5000, success=False)))
    assert (answer.status, answer.http_status, answer.body()) == (
        "ignored",
        200,
        {"status": "ignored", "reason": "event_type"},
    )
    assert laps(answer) == ["verify", "parse", "total"]
    assert verdicts("paystack", "unit-failed") == ["ignored"]


def test_a_credit_then_its_repeat_answer_credited_then_duplicate(hooks):
    raw = encode(payload("standard", "unit-pay-1", 250050, "NGN", "Ada@Example.com"))
    first = receive(hooks, "standard", raw)
    assert (first.status, first.http_status, first.body()) == (Verdict.CREDITED, 200, {"status": "credited"})
    # the credit's laps: the wait for a database connection, its transaction, the claim's release
    assert laps(first) == ["verify", "parse", "dedupe", "db_wait", "ledger", "release", "total"]
    again = receive(hooks, "standard", raw)
    assert (again.status, again.http_status) == (Verdict.DUPLICATE, 200)
    assert laps(again) == ["verify", "parse", "dedupe", "total"]  # the marker: no database
    assert json.dumps(again.body()) == '{"status": "duplicate"}'
    assert balance("ada@example.com", "NGN") == 250050
    assert verdicts("standard", "unit-pay-1") == ["credited", "duplicate"]


def test_a_webhook_whose_reference_is_claimed_answers_409_in_flight(hooks):
    raw = encode(payload("paystack", "unit-held", 5000))
    held = gate.enter(
        hooks.store,
        hooks.queue_redis,
        hooks.queue,
        notifications.parse("paystack", raw),
        ledger.receipt("paystack", raw, {}),
        claim_ttl_ms=30_000,
    )
    assert held.verdict == gate.CLAIMED
    answer = receive(hooks, "paystack", raw)
    assert (answer.status, answer.http_status, answer.body()) == (Verdict.IN_FLIGHT, 409, {"status": "in_flight"})
    assert counts()["payments"] == 0


def test_a_refund_before_its_payment_answers_payment_not_found_then_debits(hooks):
    refund = encode(refund_payload("monnify", "unit-rf-1", "unit-pay-2", 1000, "NGN", "ada@example.com"))
    early = receive(hooks, "monnify", refund)
    assert (early.status, early.http_status) == (Verdict.PAYMENT_NOT_FOUND, 409)
    body = early.body()
    assert body["status"] == body["error"]["code"] == "payment_not_found" and body["error"]["message"]
    assert "Server-Timing" in early.headers
    # its claim was released: once the payment is credited, the provider's retry debits
    assert receive(hooks, "monnify", encode(payload("monnify", "unit-pay-2", 5000))).status == Verdict.CREDITED
    assert receive(hooks, "monnify", refund).status == Verdict.DEBITED
    assert balance("ada@example.com", "NGN") == 4000


def test_signed_garbage_raises_invalid_payload_and_is_recorded(hooks):
    raw = b'{"event": "charge.success", "data": {"amount": 100}}'
    with pytest.raises(InvalidPayload):
        receive(hooks, "paystack", raw)
    assert verdicts("paystack") == ["invalid_payload"]


def test_an_unknown_or_unconfigured_provider_is_refused_before_anything_is_read(app, redis_server, database_url):
    unset = build(app, secrets={"paystack": ("sk_only_paystack",)})
    with pytest.raises(NotFound):
        unset.secrets_of("paypal")
    with pytest.raises(FloodgateError) as caught:
        receive(unset, "stripe", b"{}", headers={})
    assert (caught.value.status, caught.value.code) == (503, "provider_not_configured")
    assert unset.secrets_of("paystack") == ("sk_only_paystack",)


def test_nobody_listening_a_credit_wakes_no_worker_and_an_enabled_endpoint_makes_it(app, redis_server, database_url):
    from webhooks.events import endpoints

    quiet = build(app)
    quiet.listening.ttl_s = 0  # read the endpoints at every credit
    redis = quiet.queue_redis.redis
    assert receive(quiet, "paystack", encode(payload("paystack", "unit-quiet", 7000))).status == Verdict.CREDITED
    assert redis.llen(keys.OUTBOX_WAKE) == 0  # the event is written; the sweep fans it out to nobody
    with db.connection_context():
        endpoints.save("app", {"url": "http://127.0.0.1:9/hooks"})
    assert receive(quiet, "paystack", encode(payload("paystack", "unit-heard", 7000))).status == Verdict.CREDITED
    assert redis.llen(keys.OUTBOX_WAKE) == 1


def test_a_credit_wakes_the_events_worker_and_a_duplicate_does_not(app, redis_server, database_url, tmp_path):
    """On a Redis of its own for the queues: the run's events worker, still waiting for a wake-up
    after another test's drain, took this one before the test looked at it (seen under load)."""
    private = RedisServer(tmp_path / "queues")
    private.start()
    try:
        svc = services.of(app)
        queue_redis = Store(private.client())
        config = dataclasses.replace(svc.config, payment_events_url="http://127.0.0.1:9/events")
        queue = Queue(svc.queue.name, connection=private.client(decode_responses=False))
        announcing = PaymentWebhooks.build(config, svc.store, queue_redis, queue)
        wakes_once_per_credit(announcing)
    finally:
        private.kill()


def wakes_once_per_credit(announcing: PaymentWebhooks) -> None:
    redis = announcing.queue_redis.redis
    redis.set(keys.OUTBOX_SCHEDULED, "1")  # a drain is scheduled already: nothing enqueued here
    raw = encode(payload("paystack", "unit-announced", 7000))
    assert receive(announcing, "paystack", raw).status == Verdict.CREDITED
    assert redis.lrange(keys.OUTBOX_WAKE, 0, -1) == ["1"]
    redis.delete(keys.OUTBOX_WAKE)
    assert receive(announcing, "paystack", raw).status == Verdict.DUPLICATE
    assert redis.llen(keys.OUTBOX_WAKE) == 0


def test_a_credit_gives_its_database_connection_back_before_the_claim_is_released(hooks, monkeypatch):
    """The web path takes a connection for the credit's transaction only: by the time the claim
    is released in Redis (and the answer written), another request can have it. A connection
    the caller already holds is left alone."""
    from webhooks.storage.records.db import close_db

    held_at_release: list[bool] = []
    release = gate.finish

    def watching(*args, **kwargs):
        held_at_release.append(not db.is_closed())
        return release(*args, **kwargs)

    monkeypatch.setattr(gate, "finish", watching)
    raw = encode(payload("paystack", "unit-borrowed", 5000))
    try:  # as the view calls it: no connection open before, the request's teardown after
        headers = CaseInsensitiveDict(signed_headers("paystack", raw))
        answer = hooks.receive("paystack", raw, headers, "req-b", time.time())
    finally:
        close_db()
    assert answer.status == Verdict.CREDITED
    raw = encode(payload("paystack", "unit-borrowed-2", 5000))
    assert receive(hooks, "paystack", raw).status == Verdict.CREDITED  # the caller's open connection
    assert held_at_release == [False, True]
    assert balance("ada@example.com", "NGN") == 10000
