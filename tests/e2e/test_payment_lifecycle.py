"""The payment lifecycle on the whole stack: gunicorn + gevent, the RQ worker, the scheduler, a
private redis-server that is restarted empty, the database, and the application as a real
HTTP server that verifies every event with the standardwebhooks library."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from testkit.events import EVENTS_SECRET, EventReceiver, event_rows
from testkit.payments import PROVIDERS, REFUND_PROVIDERS, deliver, encode, payload, refund_payload
from testkit.servers import ROOT, Proc, RedisServer, WebServer, free_port, venv_bin, wait_until
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Wallet

pytestmark = pytest.mark.e2e  # processes of its own, killed -9, a Redis restarted empty


@dataclass
class Stack:
    """Web, worker and scheduler on a private Redis, announcing to `receiver`."""

    env: dict
    redis: RedisServer
    web: WebServer
    logs: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, args: list[str]) -> Proc:
        proc = Proc(args, self.env, self.logs / f"{name}{len(self.procs)}.log")
        self.procs.append(proc)
        return proc

    def worker(self, *queues: str) -> Proc:
        """An RQ worker on `queues` (default both: the Procfile runs one process for each)."""
        return self.start(
            "worker",
            [
                venv_bin("rq"),
                "worker",
                "--url",
                self.redis.url,
                "--with-scheduler",
                "-w",
                "rq.worker.SimpleWorker",
                *(queues or ("floodgate", "floodgate-events")),
            ],
        )

    def scheduler(self) -> Proc:
        return self.start("scheduler", [sys.executable, "-m", "workers.schedule"])


@pytest.fixture
def receiver():
    server = EventReceiver()
    yield server
    server.close()


@contextmanager
def running_stack(base_env: dict, tmp_path: Path, extra_env: dict) -> Iterator[Stack]:
    """A private Redis and gunicorn (two workers) with fast event retries and `extra_env`;
    the worker and scheduler as a test starts them; everything killed at the end."""
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    env = {
        **base_env,
        "REDIS_URL": redis_server.url,
        "RQ_REDIS_URL": redis_server.url,
        "PAYMENT_EVENTS_RETRY_BASE_MS": "50",
        "PAYMENT_EVENTS_RETRY_MAX_MS": "500",
        "PAYMENT_EVENTS_TIMEOUT_MS": "5000",
        "DB_POOL_SIZE": "6",
        **extra_env,
    }
    web = WebServer(env, tmp_path / "web.log", workers=2)
    made = Stack(env, redis_server, web, tmp_path)
    try:
        yield made
    finally:
        for proc in made.procs:
            proc.stop(sig=signal.SIGKILL)
        web.stop()
        redis_server.kill()


@pytest.fixture
def stack(base_env, database_url, receiver, tmp_path):
    extra = {"PAYMENT_EVENTS_URL": receiver.url, "PAYMENT_EVENTS_SECRET": EVENTS_SECRET}
    with running_stack(base_env, tmp_path, extra) as made:
        yield made


def deliver_until_answered(base: str, provider: str, raw: bytes, session: requests.Session) -> requests.Response:
    """As a provider: a 409 (in flight, payment not found yet) or 503 is delivered again."""
    while True:
        resp = deliver(base, provider, raw, session=session)
        if resp.status_code not in (409, 503):
            return resp


@dataclass(frozen=True)
class Announced:
    """A wallet event as PAYMENT_EVENTS_URL gets it: `event_id` is its webhook-id."""

    id: int
    event_id: str
    type: str
    customer: str
    status: str
    attempts: int
    body: str
    provider: str
    reference: str


def all_events() -> list[Announced]:
    return [
        Announced(
            r["row"],
            r["id"],
            r["type"],
            r["customer"],
            r["status"],
            r["attempts"],
            json.dumps(r["body"]),
            r["body"]["data"]["provider"],
            r["body"]["data"]["reference"],
        )
        for r in event_rows()
    ]


def all_delivered(receiver: EventReceiver, expected: int) -> bool:
    events = all_events()
    return (
        len(events) == expected
        and all(e.status == "delivered" for e in events)
        and receiver.accepted_ids() == {e.event_id for e in events}
    )


def assert_in_order_per_wallet(receiver: EventReceiver) -> None:
    """The events of each wallet (customer and currency) were first accepted in the order their
    changes committed: a wallet's changes are serialised by its row lock, and each inserts its
    event after taking it, so their ids are in commit order."""
    ids = {e.event_id: ((e.customer, json.loads(e.body)["data"]["currency"]), e.id) for e in all_events()}
    first: dict[tuple[str, str], list[int]] = defaultdict(list)
    seen = set()
    for arrival in receiver.accepted():
        if arrival.event_id not in seen:
            seen.add(arrival.event_id)
            wallet, row = ids[arrival.event_id]
            first[wallet].append(row)
    assert {w: rows for w, rows in first.items() if rows != sorted(rows)} == {}


def assert_balances_follow_the_changes() -> None:
    """In each wallet's events, balance_minor is the running sum of the changes before it."""
    running: dict[tuple[str, str], int] = defaultdict(int)
    for e in all_events():
        data = json.loads(e.body)["data"]
        key = (data["customer"], data["currency"])
        running[key] += data["amount_minor"] if e.type == "wallet.credited" else -data["amount_minor"]
        assert data["balance_minor"] == running[key], (e.event_id, data, running[key])


def test_every_event_arrives_through_receiver_failures_a_killed_worker_and_an_empty_redis(stack, receiver):
    session = requests.Session()
    customers = [f"c{i}@example.com" for i in range(4)]
    made = {"n": 0}

    def credits(count: int) -> None:
        for _ in range(count):
            n = made["n"] = made["n"] + 1
            customer = customers[n % len(customers)]
            resp = deliver_until_answered(
                stack.web.url, "standard", encode(payload("standard", f"std-{n}", 1_000 + n, "NGN", customer)), session
            )
            assert resp.json() == {"status": "credited"}, resp.text
            if n % 3 == 0:
                raw = encode(refund_payload("standard", f"rf-{n}", f"std-{n}", 100 + n, "NGN", customer))
                assert deliver_until_answered(stack.web.url, "standard", raw, session).json() == {"status": "debited"}

    def changes() -> int:
        return made["n"] + made["n"] // 3

    worker = stack.worker()
    # 1. the application fails the first attempts: they are retried, with the same webhook-id
    receiver.fail_next = 5
    credits(9)
    wait_until(lambda: all_delivered(receiver, changes()), timeout=60, what="first events after 500s")
    assert Counter(a.status for a in receiver.arrivals)[500] == 5

    # 2. the application is down for a while: attempts fail and back off, nothing is lost
    receiver.stop()
    credits(9)
    wait_until(
        lambda: sum(e.attempts for e in all_events() if e.status == "pending") >= 6,
        timeout=60,
        what="attempts against a receiver that is down",
    )
    receiver.start()
    wait_until(lambda: all_delivered(receiver, changes()), timeout=60, what="events after the receiver is back")

    # 3. the worker is killed -9 while a delivery is in flight
    receiver.hold()
    credits(6)
    wait_until(lambda: any(a.status is None for a in receiver.arrivals), timeout=60, what="a delivery in flight")
    worker.stop(sig=signal.SIGKILL)
    receiver.release()  # its answer reaches nobody: the event stays pending
    assert any(e.status == "pending" for e in all_events())

    # 4. Redis restarted empty: no job, flag or lock refers to the pending events any more; the
    # scheduler's sweep finds them in the database and a new worker delivers them
    stack.redis.restart_empty()
    stack.worker()
    stack.scheduler()
    wait_until(lambda: all_delivered(receiver, changes()), timeout=90, what="pending events after the Redis loss")
    credits(3)  # and the usual path works on the new Redis
    wait_until(lambda: all_delivered(receiver, changes()), timeout=60, what="events after the restart")

    session.close()  # an idle keep-alive connection would hold gunicorn's graceful stop (keepalive 5 s)
    assert receiver.arrivals and all(a.verified for a in receiver.arrivals)
    assert len(all_events()) == changes() == 36
    assert_in_order_per_wallet(receiver)
    assert_balances_follow_the_changes()


def test_thousand_payments_five_shuffled_deliveries_and_a_refund_for_every_tenth(stack, receiver):
    stack.worker()
    rng = random.Random(15)
    customers = [f"payer{i}@example.com" for i in range(40)]
    work, expected = [], defaultdict(int)
    for n in range(1000):
        refunded = n % 10 == 0
        provider = REFUND_PROVIDERS[(n // 10) % len(REFUND_PROVIDERS)] if refunded else PROVIDERS[n % len(PROVIDERS)]
        currency = rng.choice(["NGN", "USD", "GHS", "JPY"])
        customer, amount = rng.choice(customers), rng.randint(100, 5_000_000)
        work += [("pay", n, provider, encode(payload(provider, f"bulk-{n}", amount, currency, customer)))] * 5
        expected[(customer, currency)] += amount
        if refunded:
            back = rng.randint(1, amount)
            work += [
                (
                    "refund",
                    n,
                    provider,
                    encode(refund_payload(provider, f"bulk-rf-{n}", f"bulk-{n}", back, currency, customer)),
                )
            ] * 5
            expected[(customer, currency)] -= back
    rng.shuffle(work)
    queue, lock, answers, early = deque(work), threading.Lock(), [], Counter()
    local = threading.local()
    sessions: list[requests.Session] = []

    def run() -> None:
        local.session = requests.Session()
        sessions.append(local.session)
        while True:
            with lock:
                if not queue:
                    return
                item = queue.popleft()
            kind, n, provider, raw = item
            resp = deliver(stack.web.url, provider, raw, session=local.session)
            if resp.status_code in (409, 503):  # in flight, or a refund before its payment: again later
                with lock:
                    queue.append(item)
                    early[resp.json().get("status")] += 1
                continue
            with lock:
                answers.append((kind, n, resp.status_code, resp.json().get("status")))

    with ThreadPoolExecutor(32) as pool:
        for f in [pool.submit(run) for _ in range(32)]:
            f.result()
    for s in sessions:  # closed: their idle keep-alive connections would hold gunicorn's stop
        s.close()

    assert [a for a in answers if a[2] != 200] == []
    assert early["payment_not_found"] > 0  # some refunds came before their payment, and waited
    done = Counter((kind, n) for kind, n, _code, status in answers if status in ("credited", "debited"))
    assert len(done) == 1_100 and set(done.values()) == {1}
    with db.connection_context():
        wallets = {(w.customer, w.currency): w.balance_minor for w in Wallet.select()}
    assert wallets == dict(expected)

    wait_until(lambda: all_delivered(receiver, 1_100), timeout=120, what="1,100 events delivered")
    events = all_events()
    assert Counter(e.type for e in events) == {"wallet.credited": 1_000, "wallet.debited": 100}
    assert len({(e.provider, e.type, e.reference) for e in events}) == 1_100  # one per wallet change
    assert len({a.event_id for a in receiver.accepted()}) == 1_100 and all(a.verified for a in receiver.arrivals)
    assert_in_order_per_wallet(receiver)
    assert_balances_follow_the_changes()


def test_gunicorn_does_not_start_with_an_unusable_events_secret(base_env):
    env = {
        **base_env,
        "PAYMENT_EVENTS_URL": "http://127.0.0.1:9/events",
        "PAYMENT_EVENTS_SECRET": "whsec_%%not-base64%%",
        "PORT": str(free_port()),
    }
    done = subprocess.run(
        [venv_bin("gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "PAYMENT_EVENTS_SECRET: secret 1 of 1 is not valid base64" in done.stderr, done.stderr[-2000:]
    assert "%%not-base64%%" not in done.stderr + done.stdout and "Traceback" not in done.stderr
