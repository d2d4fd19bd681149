"""DELETE .../personal-data reaches every web process (leads/accounting/erasure.py): each
journal reads the erasure feed (storage/live/erasures.py), drops the lead's body and says so, and
the answer waits for every live journal's word. Journals of other processes are played by
Journal objects on the run's Redis, each read by a thread of its own as its watcher reads it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from testkit.servers import wait_until
from webhooks import services
from webhooks.leads.accounting import ledger
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.live import erasures, keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Publisher

PUB = PublisherRule(id="surge", active=True, payout_pct=Decimal("10"))
BODY = '{"lead_id": "%s", "email": "ada+%s@example.com", "phone": "+1512555010%d"}'
AT = datetime.now(timezone.utc) - timedelta(minutes=1)


def _item(lead_id: str, n: int) -> settlement.SettlementItem:
    return settlement.make_item(
        publisher=PUB,
        lead_id=lead_id,
        outcome=Outcome(attempts=[]),
        payload=BODY % (lead_id, lead_id, n),
        received_at=AT,
        request_id=None,
    )


ITEMS = [_item("gone", 1), _item("kept", 2)]


class OtherProcess:
    """Another web process's journal, holding ITEMS, read by its own thread as the watcher
    reads it, until `stop` (or `pause`: still alive by its last word, reading nothing)."""

    def __init__(self, app):
        svc = services.of(app)
        self.journal = settlement.Journal(svc.queue_redis.redis, svc.queue, keep_s=600)
        for item in ITEMS:
            self.journal._remember(
                settlement._Entry(
                    at=time.monotonic(),
                    head=item.to_json(),
                    payload=settlement._pack(item.payload),
                    answer="",
                    lead=(item.publisher_id, item.lead_id),
                )
            )
        self.running, self.reading = threading.Event(), threading.Event()
        self.running.set()
        self.reading.set()
        self.journal.forget_erased()  # its first word: alive
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while self.running.is_set():
            if self.reading.is_set():
                self.journal.forget_erased()
            time.sleep(0.02)

    def bodies(self) -> dict[str, str]:
        """Lead id -> the body the journal would push again after a loss."""
        return {e.lead[1]: json.loads(e.raw())["payload"] for e in self.journal.entries}

    def stop(self) -> None:
        self.running.clear()
        self.thread.join()


@pytest.fixture
def others(app, api) -> Iterator[list[OtherProcess]]:
    with db.connection_context():
        Publisher.create(id="surge", name="Surge", api_key_hash="h" * 64, api_key_hint="abcd", commission_pct=10)
        ledger.settle(ITEMS)
    procs = [OtherProcess(app) for _ in range(3)]
    yield procs
    for p in procs:
        p.stop()


def _erase(api, lead_id: str):
    return api.http.delete(
        f"{api.base}/v1/admin/leads/{lead_id}/personal-data", params={"publisher_id": "surge"}, headers=api.admin
    )


def test_the_answer_comes_once_every_process_has_dropped_the_body(others, api):
    assert all(p.bodies() == {i.lead_id: i.payload for i in ITEMS} for p in others)
    resp = _erase(api, "gone")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["personal_data"], body["web_processes"]) == ("erased", "forgotten")
    # the run's Redis keeps no files: nothing to rewrite, and the answer says so
    assert (body["redis_files"], body["redis_rewritten_at"]) == ("not_persisted", None)
    for p in others:  # at once: the answer waited for them
        assert p.bodies() == {"gone": "", "kept": ITEMS[1].payload}


def test_a_live_process_that_has_not_read_the_erasure_makes_the_answer_202_pending(others, api, reconfigure):
    reconfigure(erasure_wait_s=1)
    others[0].reading.clear()  # alive by its last word (under a second old), reading nothing now
    resp = _erase(api, "gone")
    assert resp.status_code == 202, resp.text
    assert (resp.json()["personal_data"], resp.json()["web_processes"]) == ("erased", "pending")
    assert others[0].bodies()["gone"] == ITEMS[0].payload
    others[0].reading.set()
    wait_until(lambda: others[0].bodies()["gone"] == "", what="the late process to drop the body")
    again = _erase(api, "gone")  # asked again: every process has it now
    assert (again.status_code, again.json()["web_processes"]) == (200, "forgotten")


def test_a_process_silent_past_the_alive_window_is_not_waited_for(others, api, app, reconfigure):
    reconfigure(erasure_wait_s=5)
    queue_redis = services.of(app).queue_redis.redis
    silent = int(time.time() * 1000) - erasures.ALIVE_MS - 1000
    queue_redis.hset(keys.ERASURES_SEEN, "gone-process", f"{erasures.START}|{silent}")
    resp = _erase(api, "gone")
    assert (resp.status_code, resp.json()["web_processes"]) == (200, "forgotten")


def test_the_feed_is_read_past_one_round_trip_of_erasures(app):
    queue_redis = services.of(app).queue_redis.redis
    many = [("surge", f"L{i}") for i in range(erasures.READ_COUNT + 5)]
    for lead in many:
        erasures.announce(queue_redis, lead=lead, keep_s=600)
    read = erasures.read(queue_redis, process="p", after=erasures.START)
    assert read.leads == frozenset(many)
    assert erasures.read(queue_redis, process="p", after=read.last).leads == frozenset()
