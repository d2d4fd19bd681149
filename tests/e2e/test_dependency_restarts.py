"""Every process of the Procfile outlives its dependencies (API.md "Nothing outside can stall or
exhaust Floodgate"): web, worker, events worker and scheduler, each started from its own
Procfile line, serve leads and payments while their redis-server goes away (long enough for
every client's retries to give up) and comes back empty, or while their database link is cut
and restored. No process exits, and what is sent once the dependency is back is served."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest
import redis
import requests
from rq import Queue
from rq.registry import StartedJobRegistry

from testkit.payments import balance, child_pids, deliver, encode, payload
from testkit.servers import ROOT, Proc, RedisServer, TcpProxy, WebServer, wait_until
from tests.conftest import Api
from webhooks.storage.live.outbox_queue import EVENTS
from webhooks.storage.live.settle_queue import RETRY, SETTLE
from workers import schedule

pytestmark = pytest.mark.e2e  # processes of its own, a Redis killed and restarted empty

PROCESSES = ("worker", "events", "scheduler")  # started from the Procfile, beside `web`
AMOUNT = 100  # minor units per payment
# What a process's log shows once it has met Redis being away (RQ's and redis-py's words, or ours)
MET_REDIS_DOWN = ("ConnectionError", "Connection refused", "could not connect to Redis", "Redis unavailable")
MET_DB_DOWN = ("OperationalError", "InterfaceError", "database unavailable")


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line.strip() and not line.startswith("#"))


def venv_path() -> str:
    """PATH with the venv's commands first, as a Procfile platform's shell finds them."""
    return str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")


@contextmanager
def procfile_process(name: str, base_env: dict, tmp_path: Path) -> Iterator[tuple[RedisServer, Proc]]:
    """The Procfile's line `name`, run by a shell on a private redis-server; afterwards it,
    what is left of its process group (a scheduler it forked) and the server are killed."""
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    env = {**base_env, "REDIS_URL": redis_server.url, "RQ_REDIS_URL": redis_server.url, "PATH": venv_path()}
    proc = Proc(["bash", "-c", "exec " + procfile()[name]], env, tmp_path / f"{name}.log")
    try:
        yield redis_server, proc
    finally:
        proc.stop(sig=signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group's leftovers (stop: only while it lives)
        redis_server.kill()


@dataclass
class Stack:
    redis: RedisServer
    web: WebServer
    procs: dict[str, Proc]
    api: Api

    def pids(self) -> dict[str, int | None]:
        """Each process's pid while it runs (None once it exited)."""
        every = {"web": self.web, **self.procs}
        return {name: proc.pid if proc.alive() else None for name, proc in every.items()}

    def logged_since(self, name: str, offset: int) -> str:
        with open(self.procs[name].log, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")

    def ended(self, before: dict[str, int | None]) -> str:
        """The log's tail of each process that is not the one started (a str, which pytest
        prints whole, where the repr of a dict of logs was cut before the one that ended)."""
        now = self.pids()
        return "\n".join(
            f"--- {name} ended ---\n{self.procs[name].output()}" for name in now if now[name] != before[name]
        )

    def log_sizes(self) -> dict[str, int]:
        return {name: proc.log.stat().st_size for name, proc in self.procs.items()}


@contextmanager
def procfile_stack(base_env: dict, tmp_path: Path, database_url: str) -> Iterator[Stack]:
    """gunicorn and the Procfile's worker, events and scheduler lines (run as a Procfile
    platform runs them: by a shell, the venv's commands on PATH) on a private redis-server."""
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    env = {
        **base_env,
        "REDIS_URL": redis_server.url,
        "RQ_REDIS_URL": redis_server.url,
        "DATABASE_URL": database_url,
        "DB_POOL_SIZE": "4",
        "PATH": venv_path(),
    }
    web = WebServer(env, tmp_path / "web.log", workers=1)
    lines = procfile()
    procs = {
        name: Proc(["bash", "-c", "exec " + lines[name]], env, tmp_path / f"{name}.log")
        for name in PROCESSES
        if name in lines
    }
    stack = Stack(redis_server, web, procs, Api(web.url))
    try:
        yield stack
    finally:
        stack.api.http.close()
        for proc in procs.values():
            proc.stop()
        web.stop()
        redis_server.kill()


@pytest.fixture
def db_proxy(database_url):
    parts = urlparse(database_url)
    if parts.scheme != "mysql":
        pytest.skip("SQLite is a file in each process: it cannot go away for a while as a server can")
    proxy = TcpProxy(parts.hostname, parts.port or 3306)
    yield proxy
    proxy.stop()


class Traffic:
    """Leads from a few publisher threads and payments from a provider thread, until stopped:
    every answer kept with the moment it was sent."""

    def __init__(self, api: Api, api_key: str, lead_threads: int = 3):
        self.api, self.key = api, api_key
        self.leads: list[tuple[str, int, float]] = []  # (lead_id, status code, sent at)
        self.payments: list[tuple[str, int, float]] = []  # (reference, status code, sent at)
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send_leads) for _ in range(lead_threads)]
        self._threads.append(threading.Thread(target=self._send_payments))
        for t in self._threads:
            t.start()

    def _send_leads(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                lead_id, sent = f"lead-{next(self._ids)}", time.monotonic()
                try:
                    status = self.api.post_lead(self.key, {"lead_id": lead_id}, session=session).status_code
                except requests.RequestException:
                    status = 0
                self.leads.append((lead_id, status, sent))

    def _send_payments(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                self.payments.append(self.pay(f"pay-{next(self._ids)}", session))
                time.sleep(0.05)

    def pay(self, reference: str, session: requests.Session) -> tuple[str, int, float]:
        raw, sent = encode(payload("paystack", reference, AMOUNT, "NGN", "ada@example.com")), time.monotonic()
        try:
            return reference, deliver(self.api.base, "paystack", raw, session=session).status_code, sent
        except requests.RequestException:
            return reference, 0, sent

    def answered(self, status: int, after: float = 0.0) -> list[str]:
        return [lead for lead, code, sent in self.leads if code == status and sent > after]

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def pay_until_recorded(self) -> int:
        """As a provider: every payment not answered 200 is delivered again until it is; how many."""
        with requests.Session() as session:
            for reference, code, _sent in self.payments:
                while code != 200:
                    code = self.pay(reference, session)[1]
        return len(self.payments)


def start_traffic(stack: Stack, buyer_server) -> Traffic:
    buyer_server.add("steady")
    key = stack.api.put_publisher("steady-pub")
    stack.api.put_buyer("steady", buyer_server.url("steady"))
    stack.api.settle_config()
    traffic = Traffic(stack.api, key)
    wait_until(lambda: traffic.answered(200), timeout=30, what="leads answered")
    stack.api.wait_settled(traffic.answered(200)[0], "steady-pub", timeout=30)
    return traffic


def settled(api: Api, lead_id: str) -> bool:
    return api.get(f"/v1/admin/leads/{lead_id}", params={"publisher_id": "steady-pub"}).status_code == 200


def periodic_job_finished(stack: Stack, func: str) -> bool:
    """The periodic job of `func` ran to its end on the Redis as it is now."""
    definition = next(d for d in schedule.PERIODIC if d["func"] == func)
    with stack.redis.client() as client:
        return client.hget(f"rq:job:{schedule.job_id(definition)}", "status") == "finished"


def test_a_redis_restart_under_load_ends_no_process_and_work_resumes(base_env, database_url, tmp_path, buyer_server):
    with procfile_stack(base_env, tmp_path, database_url) as stack:
        traffic = start_traffic(stack, buyer_server)
        before = stack.pids()
        sizes = stack.log_sizes()
        stack.redis.kill()
        try:
            # down long enough that every client met it: redis-py's retries (about 5 s) gave up
            # in each process, the web answered 503
            wait_until(lambda: traffic.answered(503), timeout=30, what="a 503 while Redis is away")
            for name in stack.procs:
                wait_until(
                    lambda name=name: (
                        not stack.procs[name].alive()
                        or any(s in stack.logged_since(name, sizes[name]) for s in MET_REDIS_DOWN)
                    ),
                    timeout=60,
                    what=f"the {name} meeting the outage",
                )
        finally:
            stack.redis.start()  # empty: every key is gone, the ledger is not
        back = time.monotonic()
        try:
            wait_until(lambda: traffic.answered(200, after=back), timeout=120, interval=0.2, what="leads after Redis")
            wait_until(
                lambda: any(settled(stack.api, lead) for lead in traffic.answered(200, after=back)[:20]),
                timeout=60,
                interval=0.3,
                what="a lead sent after Redis came back settled",
            )
            wait_until(
                lambda: any(code == 200 and sent > back for _ref, code, sent in traffic.payments),
                timeout=60,
                what="a payment credited after Redis came back",
            )
            for func in ("workers.settle.sweep", "workers.outbox.sweep"):
                wait_until(lambda f=func: periodic_job_finished(stack, f), timeout=60, what=f"{func} run again")
        finally:
            traffic.stop()
        assert stack.pids() == before, stack.ended(before)
        assert {code for _lead, code, _sent in traffic.leads} <= {200, 503}
        paid = traffic.pay_until_recorded()
        assert balance("ada@example.com", "NGN") == paid * AMOUNT  # each payment once, none lost


def test_a_database_outage_under_load_ends_no_process_and_work_resumes(
    base_env, database_url, db_proxy, tmp_path, buyer_server
):
    with procfile_stack(base_env, tmp_path, db_proxy.url_for(database_url)) as stack:
        traffic = start_traffic(stack, buyer_server)
        before = stack.pids()
        sizes = stack.log_sizes()
        db_proxy.stop()  # every connection dropped, new ones refused
        try:
            wait_until(
                lambda: any(code == 503 for _ref, code, _sent in traffic.payments[-5:]),
                timeout=30,
                what="a payment answered 503 while the database is away",
            )
            wait_until(
                lambda: (
                    any(s in stack.logged_since("worker", sizes["worker"]) for s in MET_DB_DOWN)
                    or not stack.procs["worker"].alive()
                ),
                timeout=60,
                what="the worker meeting the outage",
            )
        finally:
            db_proxy.start()
        back = time.monotonic()
        try:
            wait_until(
                lambda: any(code == 200 and sent > back for _ref, code, sent in traffic.payments),
                timeout=60,
                what="a payment credited after the database came back",
            )
            wait_until(
                lambda: any(settled(stack.api, lead) for lead in traffic.answered(200, after=back)[:20]),
                timeout=90,
                interval=0.3,
                what="a lead sent after the database came back settled",
            )
        finally:
            traffic.stop()
        assert stack.pids() == before, stack.ended(before)
        paid = traffic.pay_until_recorded()
        assert balance("ada@example.com", "NGN") == paid * AMOUNT  # each payment once, none lost


def test_an_events_job_whose_worker_died_is_handed_back_by_the_scheduler(base_env, tmp_path):
    """A drain left in the events queue's started registry (its worker killed -9, or Redis away
    as it ended) is handed back by the scheduler's poll, as a settlement drain is."""
    with (
        procfile_process("events", base_env, tmp_path) as (redis_server, worker),
        redis.Redis.from_url(redis_server.url) as connection,
    ):
        job = Queue(EVENTS, connection=connection).enqueue("time.sleep", 60, retry=RETRY)
        started = StartedJobRegistry(EVENTS, connection=connection)
        wait_until(lambda: started.get_job_ids(), timeout=30, what="the job to start")
        worker.stop(sig=signal.SIGKILL)
        # its heartbeat would run out a minute and a half later: aged here rather than waited for
        connection.zadd(started.key, {m: time.time() - 1 for m in connection.zrange(started.key, 0, -1)})
        assert schedule.requeue_abandoned(connection) == [job.id]
        assert job.get_status(refresh=True) in ("queued", "scheduled")  # to run again


def test_a_stop_mid_job_ends_the_worker_and_its_scheduler_without_starting_another(base_env, tmp_path):
    """A deploy's SIGTERM reaches the Procfile's worker and the scheduler it forked while a job
    runs: the job finishes, then both exit. The worker starts its scheduler again after a job
    when it is not running (one a Redis outage ended); it did so during a stop too, the stop's
    signal could reach the new process before its handlers were set, and the worker then waited
    for it until killed (scripts/run's Ctrl-C took its 40 s grace in about half the runs)."""
    with (
        procfile_process("worker", base_env, tmp_path) as (redis_server, worker),
        redis.Redis.from_url(redis_server.url) as connection,
    ):
        forked = "Scheduler for floodgate started with PID"  # RQ's words, in the forked process
        wait_until(lambda: forked in worker.output(), timeout=30, what="the scheduler")
        Queue(SETTLE, connection=connection).enqueue("time.sleep", 1)
        started = StartedJobRegistry(SETTLE, connection=connection)
        wait_until(lambda: started.get_job_ids(), timeout=30, what="the job to start")
        os.killpg(worker.pid, signal.SIGTERM)  # the group, as a deploy's stop or scripts/run's
        try:
            worker.proc.wait(timeout=30)  # the job's second and the scheduler's one-second turn
        except subprocess.TimeoutExpired:
            raise AssertionError("the worker still runs 30 s after SIGTERM:\n" + worker.output()) from None
        assert worker.output().count(forked) == 1, worker.output()


def test_a_worker_killed_9_takes_its_scheduler_with_it(base_env, tmp_path):
    """The Procfile's worker forks RQ's scheduler (--with-scheduler), which RQ stops only by a
    signal: after a kill -9 of the worker (the OOM killer, a hard stop) it ran on under PID 1,
    holding the scheduler lock in a dead worker's name, one more such process per death.
    It now sees its worker gone within a heartbeat, releases the lock and exits."""
    lock = "rq:scheduler-lock:floodgate"
    with (
        procfile_process("worker", base_env, tmp_path) as (redis_server, worker),
        redis.Redis.from_url(redis_server.url) as connection,
    ):
        wait_until(lambda: connection.exists(lock), timeout=30, what="the scheduler to take its lock")
        [scheduler] = wait_until(lambda: child_pids(worker.pid), what="the scheduler process")
        os.kill(worker.pid, signal.SIGKILL)  # the worker alone, not its process group

        def scheduler_gone() -> bool:
            try:
                return Path(f"/proc/{scheduler}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                return True

        wait_until(scheduler_gone, timeout=30, what="the orphaned scheduler to exit")
        assert not connection.exists(lock)


def test_an_error_rq_does_not_expect_ends_no_worker(base_env, tmp_path):
    """RQ ends its work loop, and with it the Procfile's worker, on any error it does not expect
    ("found an unhandled exception, quitting..."). Here Redis refuses the wait for a job for a while (an ACL,
    as an operator's slip or a proxy in front of Redis might): the worker enters its loop again
    once Redis takes it, at growing intervals meanwhile, and runs the next job."""
    with (
        procfile_process("worker", base_env, tmp_path) as (redis_server, worker),
        redis.Redis.from_url(redis_server.url) as connection,
    ):
        wait_until(lambda: "Listening on" in worker.output(), timeout=30, what="the worker to listen")
        connection.execute_command("ACL", "SETUSER", "default", "-blmove", "-blpop")  # RQ waits with either
        queue = Queue(SETTLE, connection=connection)
        queue.enqueue("time.sleep", 0)  # ends the wait under way; the next one is refused
        wait_until(lambda: worker.output().count("entering it again") >= 2, timeout=60, what="two refused turns")
        connection.execute_command("ACL", "SETUSER", "default", "+blmove", "+blpop")
        job = queue.enqueue("time.sleep", 0)
        wait_until(lambda: job.get_status(refresh=True) == "finished", timeout=60, what="a job run after it")
        assert worker.alive(), worker.output()
