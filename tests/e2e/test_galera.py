"""The ledger on a Galera cluster (API.md "The ledger on a cluster", issue 66): the whole stack
(gunicorn with two gevent workers and the Procfile's worker, events and scheduler lines) with
DATABASE_URL naming HAProxy in front of three Galera nodes, one writer at a time
(testkit/galera.py). The writing node is SIGKILLed during a burst of payments and leads, then
after the load, when every pooled connection points at it.

During the burst, requests in flight may fail (5xx): the test retries them as a provider or a
publisher would, and afterwards nothing is lost or doubled. After the load, once HAProxy has
moved, no request may fail for a connection the dead node held."""

from __future__ import annotations

import itertools
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field

import pymysql
import pytest
import requests

from testkit import galera
from testkit.galera import GaleraCluster
from testkit.payments import deliver, encode, payload
from testkit.servers import Proc, RedisServer, WebServer, create_mysql_db, wait_until
from tests.e2e.test_dependency_restarts import procfile, venv_path

pytestmark = pytest.mark.e2e  # a Galera cluster of its own, a node SIGKILLed

PROCESSES = ("worker", "events", "scheduler")  # the Procfile's lines beside `web`
PUBLISHER_KEY = "pk_test_galera_0123456789"
CAP = 30  # the capped buyer's daily cap; more leads than that are sent
CUSTOMERS = tuple(f"payer{i}@example.com" for i in range(4))
SETTLE_TIMEOUT_S = 60.0
# a request in flight when its node died holds its payment's or lead's claim until the claim
# expires: its retries are answered 409 until then
RETRY_TIMEOUT_S = 90.0


@dataclass
class Stack:
    cluster: GaleraCluster
    database: str  # the throw-away database's name
    web: WebServer
    procs: dict[str, Proc]
    admin: dict = field(default_factory=dict)

    def ledger(self, sql: str, *args) -> list[tuple]:
        """`sql` on the ledger through the proxy, on a connection of its own: the test's reads
        never reuse a connection a dead node held."""
        conn = pymysql.connect(
            host="127.0.0.1", port=self.cluster.proxy_port, user="root", database=self.database, connect_timeout=5
        )
        with closing(conn), conn.cursor() as c:
            c.execute(sql, args)
            return list(c.fetchall())

    def put(self, path: str, body: dict) -> None:
        resp = requests.put(self.web.url + path, json=body, headers=self.admin, timeout=30)
        assert resp.status_code == 200, resp.text

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{p.output()}" for name, p in {"web": self.web, **self.procs}.items())


@pytest.fixture(scope="module")
def galera_stack(base_env, tmp_path_factory) -> Iterator[Stack]:
    lacking = galera.missing()
    if lacking:
        pytest.skip(f"a Galera cluster cannot start here: {lacking}")  # as the ledger tests fall back to SQLite
    tmp = tmp_path_factory.mktemp("galera")
    cluster = GaleraCluster()
    redis_server = RedisServer(tmp / "redis")
    procs: dict[str, Proc] = {}
    web = None
    try:
        cluster.start()
        url, _drop = create_mysql_db(cluster.proxy_url)  # the cluster's datadirs go with it
        redis_server.start()
        env = {
            **base_env,
            "DATABASE_URL": url,
            "REDIS_URL": redis_server.url,
            "RQ_REDIS_URL": redis_server.url,
            "DB_POOL_SIZE": "4",
            # 24 leads at once on a busy 2-core machine: a deadline each post keeps
            "BUYER_TIMEOUT_MS": "5000",
            "PATH": venv_path(),
        }
        lines = procfile()
        release = Proc(["bash", "-c", "exec " + lines["release"]], env, tmp / "release.log")
        assert release.proc.wait(timeout=120) == 0, release.output()  # the schema, through the proxy
        release.stop()
        web = WebServer(env, tmp / "web.log", workers=2)
        procs = {name: Proc(["bash", "-c", "exec " + lines[name]], env, tmp / f"{name}.log") for name in PROCESSES}
        stack = Stack(cluster, url.rsplit("/", 1)[1], web, procs, {"Authorization": f"Bearer {env['ADMIN_TOKEN']}"})
        yield stack
    finally:
        for proc in procs.values():
            proc.stop(sig=signal.SIGKILL)
        if web is not None:
            web.stop()
        redis_server.kill()
        cluster.stop()


@pytest.fixture
def stack(galera_stack: Stack) -> Iterator[Stack]:
    """The module's stack with every node running once the test is over (the next test starts
    from a whole cluster), and the processes' logs shown when the test fails."""
    yield galera_stack
    for name in galera_stack.cluster.nodes:
        galera_stack.cluster.start_node(name)
    assert galera_stack.cluster.size() == 3


def pay(base: str, reference: str, customer: str, amount: int, session: requests.Session) -> list[int]:
    """One Paystack delivery, delivered again as Paystack does until it is answered 200; the
    status of every attempt (0: the connection failed)."""
    raw = encode(payload("paystack", reference, amount, "NGN", customer))
    statuses: list[int] = []

    def answered() -> bool:
        try:
            statuses.append(deliver(base, "paystack", raw, session=session, timeout=30).status_code)
        except requests.RequestException:
            statuses.append(0)
        return statuses[-1] == 200

    wait_until(answered, timeout=RETRY_TIMEOUT_S, interval=0.1, what=f"payment {reference} answered 200")
    return statuses


def post_lead(base: str, lead_id: str, session: requests.Session) -> tuple[dict, list[int]]:
    """One lead, sent again with the same lead_id as a publisher does until it is answered 200;
    its answer and the status of every attempt."""
    statuses: list[int] = []

    def answer() -> dict | None:
        try:
            resp = session.post(
                f"{base}/v1/leads",
                json={"lead_id": lead_id, "state": "TX"},
                headers={"Authorization": f"Bearer {PUBLISHER_KEY}"},
                timeout=30,
            )
        except requests.RequestException:
            statuses.append(0)
            return None
        statuses.append(resp.status_code)
        assert resp.status_code in (200, 409, 500, 502, 503, 504), resp.text
        return resp.json() if resp.status_code == 200 else None

    return wait_until(answer, timeout=RETRY_TIMEOUT_S, interval=0.1, what=f"lead {lead_id} answered 200"), statuses


def test_writer_killed_during_a_burst_loses_and_doubles_nothing(stack: Stack, buyer_server) -> None:
    base, cluster = stack.web.url, stack.cluster
    stack.put("/v1/admin/publishers/galera", {"name": "Galera", "api_key": PUBLISHER_KEY})
    for priority, (buyer, caps) in enumerate((("capped", {"daily": CAP}), ("spare", {})), start=1):
        buyer_server.add(buyer)
        body = {"name": buyer, "endpoint_url": buyer_server.url(buyer), "priority": priority, "timezone": "UTC"}
        stack.put(f"/v1/admin/buyers/{buyer}", {**body, "price": "10.00", "caps": caps})
    # until the web processes have the config: the first lead sold goes to the capped buyer
    warm_ups = (f"warm-up-{i}" for i in itertools.count())

    def sold_warm_up() -> str | None:
        lead = next(warm_ups)
        with requests.Session() as s:
            return lead if post_lead(base, lead, s)[0]["status"] == "sold" else None

    warm_up = wait_until(sold_warm_up, what="a lead sold with the config just made")

    # 80 payments (4 payers), each delivered twice at once, and 120 leads, 24 at a time
    payments = [(f"gal-{i}", CUSTOMERS[i % len(CUSTOMERS)], 100 + i) for i in range(80)]
    deliveries = [p for p in payments for _ in range(2)]
    leads = [f"gal-lead-{i}" for i in range(120)]
    answered, answering = [0], threading.Lock()  # deliveries answered 200 so far
    half_way = threading.Event()
    local = threading.local()

    def session() -> requests.Session:
        if getattr(local, "session", None) is None:
            local.session = requests.Session()
        return local.session

    def one_payment(p: tuple[str, str, int]) -> list[int]:
        statuses = pay(base, *p, session=session())
        with answering:
            answered[0] += 1
            if answered[0] == len(deliveries) // 4:
                half_way.set()
        return statuses

    killed = cluster.writer()
    assert killed is not None
    with ThreadPoolExecutor(24) as leads_pool, ThreadPoolExecutor(16) as payments_pool:
        lead_answers = leads_pool.map(lambda lead_id: post_lead(base, lead_id, session()), leads)
        payment_answers = payments_pool.map(one_payment, deliveries)
        assert half_way.wait(timeout=60), "a quarter of the deliveries never answered"
        cluster.kill(killed)  # while the rest are in flight
        killed_at = answered[0]
        lead_results, payment_results = list(lead_answers), list(payment_answers)
    cluster.wait_writer_moved(killed)

    failed = sum(1 for statuses in payment_results for s in statuses if s >= 500 or s == 0)
    failed += sum(1 for _a, statuses in lead_results for s in statuses if s >= 500 or s == 0)
    print(  # noqa: T201 (-s)
        f"writer {killed} killed with {killed_at} of {len(deliveries)} deliveries answered: "
        f"{failed} requests failed and were sent again"
    )
    assert killed_at < len(deliveries) * 3 // 4, "the burst was over before the writer died"
    # every payment credited once: each wallet holds the sum of its payer's distinct payments
    rows = stack.ledger("SELECT reference, COUNT(*) FROM payments GROUP BY reference")
    assert sorted(rows) == sorted((ref, 1) for ref, _c, _a in payments)
    wallets = dict(stack.ledger("SELECT customer, balance_minor FROM wallets WHERE currency = 'NGN'"))
    assert wallets == {c: sum(a for _r, who, a in payments if who == c) for c in CUSTOMERS}, failed

    # every lead settled once, the capped buyer's cap exact
    answers = {a["lead_id"]: a for a, _statuses in lead_results}
    sold_capped = {lead for lead, a in answers.items() if a["status"] == "sold" and a["buyer_id"] == "capped"}
    assert len(sold_capped) == CAP - 1, (len(sold_capped), failed)  # the warm-up took one
    wait_until(
        lambda: stack.ledger("SELECT COUNT(*) FROM leads WHERE lead_id LIKE 'gal-lead-%%'")[0][0] == len(leads),
        timeout=SETTLE_TIMEOUT_S,
        what="every lead settled",
    )
    settled = stack.ledger("SELECT lead_id, COUNT(*), status, buyer_id FROM leads GROUP BY lead_id, status, buyer_id")
    assert all(count == 1 for _l, count, _s, _b in settled), [s for s in settled if s[1] != 1]
    by_lead = {lead: (status, buyer) for lead, _c, status, buyer in settled}
    assert {lead for lead, (status, buyer) in by_lead.items() if buyer == "capped" and status == "sold"} == {
        *sold_capped,
        warm_up,
    }
    assert all(by_lead[lead] == (a["status"], a.get("buyer_id")) for lead, a in answers.items())

    cluster.start_node(killed)
    assert cluster.size() == 3
    wait_until(lambda: cluster.writer() == killed, timeout=30, what=f"HAProxy back on {killed}")


def test_writer_killed_after_the_load_fails_no_request_once_the_proxy_moved(stack: Stack) -> None:
    base, cluster = stack.web.url, stack.cluster
    customer = "after@example.com"
    with requests.Session() as s:
        for i in range(4):
            assert pay(base, f"after-{i}", customer, 500, s)[-1] == 200

    # every web process's pool full of connections to the writer: reads 24 at once, until every
    # one of them answered 200 (a connection an earlier failover left dead may fail one first)
    def read(_i: int) -> int:
        with requests.Session() as s:
            return s.get(f"{base}/v1/admin/wallets/{customer}", headers=stack.admin, timeout=30).status_code

    with ThreadPoolExecutor(24) as pool:
        wait_until(lambda: all(code == 200 for code in pool.map(read, range(48))), timeout=30, what="warm pools")

    writer = cluster.writer()
    assert writer is not None
    cluster.kill(writer)
    cluster.wait_writer_moved(writer)

    reads = [read(i) for i in range(40)]
    assert reads == [200] * 40, f"{reads.count(200)} of 40 admin reads answered 200: {reads}\n{stack.logs()[-6000:]}"
    with requests.Session() as s:
        first_tries = [pay(base, f"after-moved-{i}", customer, 500, s)[0] for i in range(5)]
        read_back = s.get(f"{base}/v1/admin/wallets/{customer}", headers=stack.admin, timeout=30)
    assert first_tries == [200] * 5, first_tries
    assert read_back.json()["balances_minor"] == {"NGN": 9 * 500}

    cluster.start_node(writer)
    assert cluster.size() == 3
