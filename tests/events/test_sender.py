"""The events' sending engine (events/sender.py), step by step against the real database and a
real local receiver that verifies each call with the standardwebhooks library: fan-out (one
dispatch per endpoint that wants an event, once), signing, a queue sent in order and stopped at
its first failure, back-off, giving up past the retry window, and an endpoint's health.
tests/events/test_endpoints.py and tests/payments/test_outbox.py run the whole engine through
the API; tests/e2e/test_event_endpoints.py runs the real worker."""

from __future__ import annotations

import json
import random
import time
from datetime import timedelta

import pytest
from standardwebhooks.webhooks import Webhook

from testkit.config import LOOPBACK_PARTNERS
from testkit.events import EVENTS_SECRET, EventReceiver
from testkit.servers import wait_until
from webhooks import config
from webhooks.events import endpoints as eps
from webhooks.events import sender
from webhooks.events.endpoints import Endpoint
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Event, EventAttempt, EventDispatch, EventEndpoint, utcnow

POLICY = sender.RetryPolicy(base_ms=60_000, max_ms=600_000, retry_for_s=3_600)


@pytest.fixture
def receiver():
    server = EventReceiver()
    yield server
    server.close()


@pytest.fixture
def ledger(database_url):
    """The (emptied) database, connected for the test."""
    with db.connection_context():
        yield


def endpoint(endpoint_id: str, url: str, types: frozenset[str] | None = None) -> Endpoint:
    EventEndpoint.create(id=endpoint_id, url=url, types=None if types is None else json.dumps(sorted(types)))
    return Endpoint(
        id=endpoint_id,
        url=url,
        types=types,
        publisher_id=None,
        secrets=(EVENTS_SECRET,),
        enabled=True,
        failing_since=None,
    )


def event(event_id: str, entity: str = "payer-1", type_: str = "wallet.credited") -> Event:
    body = '{"type": "%s", "data": {"id": "%s"}}' % (type_, event_id)
    return Event.create(event_id=event_id, type=type_, subject=event_id, entity=entity, body=body, created_at=utcnow())


def dispatches(endpoint_id: str) -> list[EventDispatch]:
    return list(EventDispatch.select().where(EventDispatch.endpoint_id == endpoint_id).order_by(EventDispatch.id))


def send_due(ep: Endpoint, at=None) -> list[tuple[sender.Due, sender.Attempt]]:
    chains = sender.due_chains(ep.id, at or utcnow(), 10, ())
    return sender.send_chains(sender.Sender(ep.url, ep.secrets, 5), chains)


def test_back_off_doubles_up_to_its_cap_with_jitter():
    policy = sender.RetryPolicy(base_ms=1_000, max_ms=60_000, retry_for_s=86_400)
    rng = random.Random(7)
    for attempts, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (30, 60.0)]:
        delays = [policy.delay_s(attempts, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempts, min(delays), max(delays))
        assert max(delays) - min(delays) > ceiling / 4  # jittered, not one fixed delay


def test_two_secrets_while_rotating_sign_each_event_twice(receiver):
    old, new = EVENTS_SECRET, "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo="
    cfg = config.load(
        {"PAYMENT_EVENTS_URL": receiver.url, "PAYMENT_EVENTS_SECRET": f"{old} {new}", **LOOPBACK_PARTNERS}
    )
    now = time.time()
    headers = sender.Sender(cfg.payment_events_url, cfg.payment_events_secrets, 5).headers("msg_1", "{}", now)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):  # a receiver on either secret accepts it
        assert Webhook(secret).verify("{}", headers) == {}


def test_fan_out_makes_one_dispatch_per_endpoint_that_wants_the_event_and_only_once(ledger):
    every = endpoint("every", "http://127.0.0.1:9/every")
    sales = endpoint("sales", "http://127.0.0.1:9/sales", frozenset({"lead.sold"}))
    event("msg_credit")
    event("msg_sold", type_="lead.sold")
    assert sender.fan_out([every, sales], utcnow()) == 2
    assert sender.fan_out([every, sales], utcnow()) == 0  # each event is fanned out once
    assert [d.event for d in dispatches("every")] == [e.id for e in Event.select().order_by(Event.id)]
    [sold] = dispatches("sales")
    assert sold.event == Event.get(Event.event_id == "msg_sold").id and sold.status == sender.PENDING
    assert len({d.webhook_id for d in dispatches("every") + dispatches("sales")}) == 3  # one id each


def test_a_queue_goes_out_signed_in_order_and_is_written_delivered(ledger, receiver):
    ep = endpoint("app", receiver.url)
    for i in range(3):
        event(f"msg_{i}")
    sender.fan_out([ep], utcnow())
    sent = send_due(ep)
    assert [a.ok for _, a in sent] == [True, True, True]
    wait_until(lambda: len(receiver.accepted()) == 3, what="three arrivals recorded")
    assert [a.body["data"]["id"] for a in receiver.accepted()] == ["msg_0", "msg_1", "msg_2"]
    assert all(a.verified for a in receiver.arrivals)
    done = sender.write([("app", sent)], POLICY, 3_600)
    assert len(done.delivered) == 3 and done.failed == [] and done.disabled == []
    assert {d.status for d in dispatches("app")} == {sender.DELIVERED}
    assert EventAttempt.select().count() == 3
    assert EventEndpoint.get_by_id("app").last_success_at is not None
    assert sender.next_due_s(["app"], utcnow()) is None and not sender.work_waiting(["app"], utcnow())


def test_a_failure_stops_its_queue_which_waits_out_the_back_off_then_goes_on_in_order(ledger, receiver):
    ep = endpoint("app", receiver.url)
    for i in range(3):
        event(f"msg_{i}")
    sender.fan_out([ep], utcnow())
    receiver.fail_next = 1
    sent = send_due(ep)
    assert [a.status_code for _, a in sent] == [500]  # the rest of the queue is not sent after it
    done = sender.write([("app", sent)], POLICY, 3_600)
    assert done.failed == ["app"] and done.gave_up == []
    first, *rest = dispatches("app")
    assert (first.status, first.attempts, first.last_error) == (sender.PENDING, 1, "HTTP 500")
    assert all(d.next_attempt_at == first.next_attempt_at for d in rest)  # the queue waits with it
    wait_s = sender.next_due_s(["app"], utcnow())
    assert wait_s is not None and 29 <= wait_s <= 60  # half to all of base_ms
    assert sender.due_chains("app", utcnow(), 10, ()) == []
    assert EventEndpoint.get_by_id("app").failing_since is not None
    later = utcnow() + timedelta(minutes=2)
    sent = send_due(ep, later)
    assert [d.dispatch.webhook_id for d, _ in sent] == [d.webhook_id for d in dispatches("app")]
    sender.write([("app", sent)], POLICY, 3_600)
    wait_until(lambda: len(receiver.arrivals) == 4, what="four arrivals recorded")
    assert [a.event_id for a in receiver.arrivals] == [first.webhook_id] * 2 + [d.webhook_id for d in rest]
    assert {d.status for d in dispatches("app")} == {sender.DELIVERED}
    assert EventEndpoint.get_by_id("app").failing_since is None  # a success heals it


def test_past_the_retry_window_a_dispatch_is_failed_and_holds_its_queue_for_an_operator(ledger, receiver):
    ep = endpoint("app", receiver.url)
    event("msg_0")
    event("msg_1")
    event("msg_other", entity="payer-2")
    sender.fan_out([ep], utcnow())
    receiver.fail = lambda body: body["data"]["id"] == "msg_0"
    sent = send_due(ep)
    done = sender.write([("app", sent)], sender.RetryPolicy(60_000, 600_000, retry_for_s=0), 3_600)
    assert done.gave_up == ["app"]
    assert [d.dispatch.webhook_id for d, _ in sent] == [
        dispatches("app")[0].webhook_id
    ]  # the first failure ends the task
    by_event = {Event.get_by_id(d.event).event_id: d for d in dispatches("app")}
    assert {e: d.status for e, d in by_event.items()} == {
        "msg_0": sender.FAILED,
        "msg_1": sender.PENDING,
        "msg_other": sender.PENDING,
    }
    assert by_event["msg_1"].next_attempt_at == sender.HELD  # behind a failed one: waits for an operator
    [chain] = sender.due_chains("app", utcnow() + timedelta(days=1), 10, ())
    assert [d.dispatch.webhook_id for d in chain] == [by_event["msg_other"].webhook_id]  # other queues go on


def test_an_endpoint_failing_for_its_window_is_disabled_and_keeps_its_events(ledger, receiver):
    ep = endpoint("app", receiver.url)
    event("msg_0")
    sender.fan_out([ep], utcnow())
    receiver.stop()  # connections refused
    sent = send_due(ep)
    assert sent[0][1].status_code is None and sent[0][1].error
    done = sender.write([("app", sent)], POLICY, disable_after_s=0)
    assert done.disabled == ["app"]
    row = EventEndpoint.get_by_id("app")
    assert (row.enabled, row.disabled_reason) == (False, eps.FAILING)
    assert [d.status for d in dispatches("app")] == [sender.PENDING]
