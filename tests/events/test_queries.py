"""The event drain's and backlog's reads use their indexes: what they read follows the queues
that wait, not every dispatch an endpoint or an entity ever had. The rows MariaDB reads are
counted (testkit/reads.py) beside a long delivered history."""

from __future__ import annotations

from datetime import timedelta

import pytest

from testkit.reads import rows_read
from webhooks.events import log as events_log
from webhooks.events import sender
from webhooks.events.endpoints import Endpoint
from webhooks.storage.records.db import db, is_mysql
from webhooks.storage.records.models import Event, EventDispatch, EventEndpoint, utcnow

HISTORY = 3000  # delivered dispatches of one entity at one endpoint


@pytest.fixture
def history(database_url):
    """Endpoint `q-a` with HISTORY delivered dispatches of entity `q-payer` and one pending,
    due now; `q-b` with none."""
    if not is_mysql():
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306): counts the rows the server reads")
    now = utcnow()
    with db.connection_context():
        for endpoint_id in ("q-a", "q-b"):
            EventEndpoint.create(id=endpoint_id, url=f"http://127.0.0.1:9/{endpoint_id}", types=None)
        rows = [
            dict(event=-i, endpoint_id="q-a", entity="q-payer", webhook_id=f"msg_q{i}", status=sender.DELIVERED,
                 created_at=now, next_attempt_at=now, delivered_at=now)
            for i in range(1, HISTORY + 1)
        ]  # fmt: skip
        last = Event.create(event_id="msg_qlast", type="wallet.credited", subject="paystack:q-last", entity="q-payer",
                            body="{}", created_at=now, fanned_out=True)  # fmt: skip
        rows.append(
            dict(event=last.id, endpoint_id="q-a", entity="q-payer", webhook_id="msg_qlast",
                 status=sender.PENDING, created_at=now, next_attempt_at=now - timedelta(seconds=1))
        )  # fmt: skip
        for i in range(0, len(rows), 500):
            EventDispatch.insert_many(rows[i : i + 500]).execute()
    yield now
    with db.connection_context():
        EventDispatch.delete().where(EventDispatch.endpoint_id.in_(["q-a", "q-b"])).execute()
        EventEndpoint.delete().where(EventEndpoint.id.in_(["q-a", "q-b"])).execute()
        Event.delete().where(Event.entity.in_(["q-payer", "q-other"])).execute()


def test_the_backlog_counts_waiting_dispatches_without_reading_the_delivered_ones(history):
    with db.connection_context():
        found: dict = {}
        assert rows_read(lambda: found.update(events_log.backlog())) < 100  # HISTORY when by status alone
        assert found["q-a"] == {sender.PENDING: 1, sender.FAILED: 0}
        assert "q-b" not in found


def test_a_due_queue_head_is_found_without_reading_its_entity_s_delivered_history(history):
    with db.connection_context():
        heads: list = []
        assert rows_read(lambda: heads.extend(sender.due_chains("q-a", utcnow(), 10, ()))) < 100
        assert [[d.dispatch.webhook_id for d in chain] for chain in heads] == [["msg_qlast"]]


def test_fanning_out_an_entity_s_event_reads_only_its_waiting_dispatches(history):
    ep = Endpoint(id="q-b", url="http://127.0.0.1:9/q-b", types=None, publisher_id=None, secrets=(),
                  enabled=True, failing_since=None)  # fmt: skip
    with db.connection_context():
        Event.update(fanned_out=True).where(Event.fanned_out == False).execute()  # noqa: E712 - SQL
        Event.create(event_id="msg_qnew", type="wallet.credited", subject="paystack:q-new", entity="q-payer",
                     body="{}", created_at=history)  # fmt: skip
        assert rows_read(lambda: sender.fan_out([ep], utcnow())) < 100
        made = EventDispatch.get(EventDispatch.endpoint_id == "q-b", EventDispatch.entity == "q-payer")
        assert made.status == sender.PENDING


def test_the_events_with_a_failed_dispatch_are_found_without_reading_every_dispatch(history):
    with db.connection_context():
        old = [
            dict(event_id=f"msg_qold{i}", type="wallet.credited", subject=f"paystack:q-old{i}", entity="q-other",
                 body='{"data": {}}', created_at=history, fanned_out=True)
            for i in range(HISTORY)
        ]  # fmt: skip
        for i in range(0, HISTORY, 500):
            Event.insert_many(old[i : i + 500]).execute()
        failed = Event.create(event_id="msg_qfailed", type="wallet.credited", subject="paystack:q-failed",
                              entity="q-other", body='{"data": {}}', created_at=history, fanned_out=True)  # fmt: skip
        EventDispatch.create(event=failed.id, endpoint_id="q-b", entity="q-other", webhook_id="msg_qfailed",
                             status=sender.FAILED, created_at=history, next_attempt_at=history)  # fmt: skip
        found: list = []
        assert rows_read(lambda: found.extend(events_log.search(status=sender.FAILED)[0])) < 100
        assert "msg_qfailed" in [e["id"] for e in found]
