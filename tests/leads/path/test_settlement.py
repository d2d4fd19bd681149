"""Settlement jobs against real processes: idempotent, retried through a database outage,
run again after a kill -9, requeued from RQ's failed registry."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from datetime import datetime, timezone
from decimal import Decimal
from urllib.parse import urlparse

import pytest
from redis import Redis
from rq import Queue
from rq.registry import FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry

from testkit.servers import Proc, TcpProxy, venv_bin, wait_until
from webhooks.caps import leases
from webhooks.leads.accounting import ledger
from webhooks.leads.accounting.item import SettlementItem
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.live import keys, settle_queue
from webhooks.storage.live.settle_queue import SETTLE, enqueue_drain
from webhooks.storage.records.db import db, is_mysql
from webhooks.storage.records.models import AuditLog, Lead, LeadAttempt, Publisher
from workers import schedule

pytestmark = pytest.mark.e2e  # RQ worker processes of its own, killed -9

PUB = PublisherRule(id="pub", active=True, payout_pct=Decimal("10"))


def sold_item(lead_id: str, price: str = "20.00") -> SettlementItem:
    out = Outcome(
        status="sold",
        buyer_id="acme",
        price=Decimal(price),
        sold_at=datetime.now(timezone.utc),
        lease=leases.Lease("acme", "lease" + lead_id, (), False, 1),
        attempts=[
            {"buyer_id": "zen", "outcome": "timeout", "ms": 1500},
            {"buyer_id": "acme", "outcome": "accepted", "ms": 41},
        ],
    )
    return settlement.make_item(
        publisher=PUB,
        lead_id=lead_id,
        outcome=out,
        payload='{"lead_id": "%s"}' % lead_id,
        received_at=datetime.now(timezone.utc),
        request_id="req-1",
    )


@pytest.fixture
def publisher(database_url):
    with db.connection_context():
        Publisher.create(id="pub", name="Pub", api_key_hash="h" * 64, api_key_hint="abcd", commission_pct=Decimal("10"))


def ledger_state():
    with db.connection_context():
        # only this module's publisher: other tests' settlements may still be draining
        return (
            Lead.select().where(Lead.publisher_id == "pub").count(),
            LeadAttempt.select().where(LeadAttempt.publisher_id == "pub").count(),
            Publisher.get_by_id("pub").balance,
            AuditLog.select().where(AuditLog.entity_id.startswith("pub:")).count(),
        )


def test_settling_the_same_item_twice_writes_it_once(publisher):
    item = sold_item("L1")
    with db.connection_context():
        assert ledger.settle([item]) == 1
        assert ledger.settle([item, item]) == 0
    assert ledger_state() == (1, 2, Decimal("2.00"), 1)


class IsolatedQueue:
    """A Redis database of the private server that no other worker of the run listens to."""

    def __init__(self, redis_server, db_index: int, env: dict, database_url: str, tmp_path):
        self.url = f"redis://127.0.0.1:{redis_server.port}/{db_index}"
        self.raw = Redis.from_url(self.url)
        self.raw.flushdb()
        self.client = redis_server.client(db=db_index)
        self.queue = Queue(SETTLE, connection=self.raw)
        self.env = {**env, "REDIS_URL": self.url, "DATABASE_URL": database_url}
        self.tmp = tmp_path
        self.workers: list[Proc] = []

    def start_worker(self) -> Proc:
        proc = Proc(
            [venv_bin("rq"), "worker", "--url", self.url, "--with-scheduler", "-w", "rq.worker.SimpleWorker", SETTLE],
            self.env,
            self.tmp / f"worker{len(self.workers)}.log",
        )
        self.workers.append(proc)
        return proc

    def push(self, *items: SettlementItem) -> None:
        settle_queue.push(self.client, self.queue, [i.to_json() for i in items])

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        self.raw.flushdb()


@pytest.fixture
def isolated(redis_server, base_env, database_url, tmp_path, request):
    made = []

    def make(db_index: int, database=None):
        q = IsolatedQueue(redis_server, db_index, base_env, database or database_url, tmp_path)
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()


def test_a_drain_job_run_twice_settles_once(publisher, isolated):
    q = isolated(3)
    q.push(sold_item("L1"), sold_item("L2"))
    enqueue_drain(q.queue)  # a second job for the same work
    q.start_worker()
    wait_until(
        lambda: ledger_state()[0] == 2 and q.queue.count == 0 and q.client.llen(keys.SETTLE_PENDING) == 0,
        what="settlement",
    )
    # the same items queued again (a re-push after a Redis loss, say) change nothing
    q.push(sold_item("L1"), sold_item("L2"))
    wait_until(lambda: q.client.llen(keys.SETTLE_PENDING) == 0, what="second drain")
    time.sleep(0.3)
    assert ledger_state() == (2, 4, Decimal("4.00"), 2)


def test_sigterm_mid_drain_stops_after_the_batch_in_hand_and_hands_the_rest_over(publisher, isolated):
    """A deploy stops the worker within one batch (not after draining everything, up to the
    job's 30 s budget), and a new worker settles the rest, each lead once."""
    q = isolated(7)
    q.push(*(sold_item(f"S{i}") for i in range(20_000)))
    worker = q.start_worker()
    wait_until(lambda: ledger_state()[0] > 0, timeout=30, what="the first batch")
    os.killpg(worker.pid, signal.SIGTERM)
    worker.proc.wait(timeout=10)  # within a batch or two; a kill would show as a timeout here
    assert "stop requested" in worker.output()
    assert q.client.llen(keys.SETTLE_PENDING) > 0 and q.queue.count >= 1  # the rest, handed over
    assert not list(q.client.scan_iter(match=keys.settle_processing("*")))  # no batch left half done
    q.start_worker()
    wait_until(lambda: ledger_state()[0] == 20_000, timeout=120, what="the rest settled")
    wait_until(lambda: q.client.llen(keys.SETTLE_PENDING) == 0, what="the queue empty")
    assert ledger_state()[:2] == (20_000, 40_000)


@pytest.fixture
def db_proxy(database_url):
    """A TCP proxy in front of the database that a test can cut, for one worker's outage."""
    parts = urlparse(database_url)
    if parts.scheme != "mysql":
        pytest.skip("the outage is simulated on the MySQL connection")
    proxy = TcpProxy(parts.hostname, parts.port or 3306)
    yield proxy
    proxy.stop()


def test_database_outage_is_retried_and_settles_after_it_returns(publisher, isolated, database_url, db_proxy):
    q = isolated(4, db_proxy.url_for(database_url))
    db_proxy.stop()  # the worker's database is gone
    q.push(sold_item("L1"))
    q.start_worker()
    failed_once = lambda: any("OperationalError" in w.output() for w in q.workers)  # noqa: E731
    wait_until(failed_once, timeout=20, what="a failed attempt")
    assert ledger_state()[0] == 0
    db_proxy.start()
    wait_until(lambda: ledger_state()[0] == 1, timeout=30, what="settlement after the outage")
    assert ledger_state() == (1, 2, Decimal("2.00"), 1)


def test_the_periodic_safety_net_rides_out_a_database_outage_without_a_failed_job(
    publisher, isolated, database_url, db_proxy
):
    """The soak's database outage left the scheduler's drain in RQ's failed registry, an
    operator's alarm for an outage that healed by itself. That job now ends quietly; its next
    run (the same job id, as rq-scheduler repeats it) takes back the batch and settles it."""
    q = isolated(8, db_proxy.url_for(database_url))
    db_proxy.stop()
    q.client.lpush(keys.SETTLE_PENDING, sold_item("N1").to_json())
    periodic = schedule.job_id(next(d for d in schedule.PERIODIC if d["func"].startswith("workers.settle")))
    func = next(d["func"] for d in schedule.PERIODIC if d["func"].startswith("workers.settle"))
    job = q.queue.enqueue(func, job_id=periodic)  # no retries, as rq-scheduler enqueues it
    q.start_worker()
    wait_until(lambda: job.get_status(refresh=True) in ("finished", "failed"), timeout=30, what="the sweep")
    assert job.get_status() == "finished" and FailedJobRegistry(queue=q.queue).count == 0
    assert ledger_state()[0] == 0 and list(q.client.scan_iter(match=keys.settle_processing(periodic)))
    db_proxy.start()
    q.queue.enqueue(func, job_id=periodic)  # its next run
    wait_until(lambda: ledger_state()[0] == 1, timeout=30, what="the held batch settled")
    wait_until(lambda: not list(q.client.scan_iter(match=keys.settle_processing("*"))), what="nothing held")


@pytest.mark.parametrize("func", ["workers.reconcile.reconcile_all", "workers.leads.sweep_abandoned"])
def test_the_other_periodic_jobs_ride_out_a_database_outage_without_a_failed_job(
    publisher, isolated, database_url, db_proxy, func
):
    """A soak run with a database outage every three minutes left two failed reconciliation
    jobs (the run that follows each Redis restart met an outage). Both periodic jobs that read
    the database end quietly; reconciliation asks for another run a minute later."""
    q = isolated(9, db_proxy.url_for(database_url))
    db_proxy.stop()
    job = q.queue.enqueue(func, job_id=schedule.job_id(next(d for d in schedule.PERIODIC if d["func"] == func)))
    q.start_worker()
    wait_until(lambda: job.get_status(refresh=True) in ("finished", "failed"), timeout=30, what="the job")
    assert job.get_status() == "finished" and FailedJobRegistry(queue=q.queue).count == 0
    again = [j for j in (q.queue.fetch_job(i) for i in ScheduledJobRegistry(queue=q.queue).get_job_ids()) if j]
    assert [j.func_name for j in again] == (["workers.reconcile.reconcile_all"] if "reconcile" in func else [])


def test_worker_killed_mid_settlement_is_run_again_and_settles_exactly_once(publisher, isolated):
    q = isolated(5)
    blocker_ready, release = threading.Event(), threading.Event()

    def hold_publisher_row():
        # Another transaction holds the publisher row: the job blocks on the commission update.
        with db.connection_context(), db.atomic():
            if is_mysql():
                list(Publisher.select().where(Publisher.id == "pub").for_update())
            else:
                Publisher.update(name="Pub").where(Publisher.id == "pub").execute()
            blocker_ready.set()
            release.wait(60)

    holder = threading.Thread(target=hold_publisher_row)
    holder.start()
    blocker_ready.wait(10)
    q.push(sold_item("L1"), sold_item("L2"))
    worker = q.start_worker()
    started = StartedJobRegistry(queue=q.queue)
    wait_until(lambda: started.get_job_ids(), what="the job to start")
    time.sleep(0.5)  # it is now blocked inside its transaction
    worker.stop(sig=signal.SIGKILL)
    release.set()
    holder.join()
    assert ledger_state()[0] == 0  # the killed transaction was rolled back
    # A minute and a half later its heartbeat has run out (aged here rather than waited for),
    # and the scheduler's next poll hands the job back to the queue:
    job_ids = started.get_job_ids(cleanup=False)
    q.client.zadd(started.key, {member: time.time() - 1 for member in q.client.zrange(started.key, 0, -1)})
    assert schedule.requeue_abandoned(q.queue.connection) == job_ids
    assert schedule.requeue_abandoned(q.queue.connection) == []
    q.start_worker()
    wait_until(lambda: ledger_state()[0] == 2, timeout=30, what="the job to run again")
    time.sleep(0.5)
    assert ledger_state() == (2, 4, Decimal("4.00"), 2)
    assert q.client.llen(keys.SETTLE_PENDING) == 0
    assert not list(q.client.scan_iter(match=keys.settle_processing("*")))


def test_failed_settlement_job_is_requeued_by_the_cli(publisher, isolated, database_url, db_proxy):
    q = isolated(6, db_proxy.url_for(database_url))
    db_proxy.stop()
    q.client.lpush(keys.SETTLE_PENDING, sold_item("L1").to_json())
    q.queue.enqueue("workers.settle.drain")  # no retries: straight to the failed registry
    q.start_worker()
    failed = FailedJobRegistry(queue=q.queue)
    wait_until(lambda: failed.count == 1, timeout=20, what="the job to fail")
    db_proxy.start()
    env = {**q.env, "DATABASE_URL": database_url}
    out = subprocess.run(
        [venv_bin("flask"), "--app", "wsgi", "settlements", "requeue"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "requeued 1 job(s)" in out.stdout
    wait_until(lambda: ledger_state()[0] == 1, timeout=30, what="the requeued job")
