"""Real servers for the whole run, clean state for each test. No mocks of Redis, MySQL or HTTP."""

from __future__ import annotations

import dataclasses
import io
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import requests
import requests.adapters
import requests.structures

from testkit import payments as testkit_payments
from testkit.cluster import LocalCluster
from testkit.config import ADMIN_TOKEN, LOOPBACK_PARTNERS, NO_PROVIDER_APIS, SECRETS
from testkit.galera import GaleraCluster
from testkit.servers import (
    BuyerServer,
    Proc,
    RedisServer,
    WebServer,
    create_mysql_db,
    mysql_admin_url,
    venv_bin,
    wait_until,
)
from webhooks import outbound, services, targets
from webhooks.storage.live import keys
from webhooks.storage.records.db import db, init_db
from webhooks.storage.records.migrate import upgrade
from webhooks.storage.records.models import ALL_MODELS, SchemaMigration

IN_PROCESS_URL = "http://floodgate.test"
CONFIG_SETTLE_S = 0.35  # > CONFIG_CHECK_INTERVAL_MS below: every web process has the change

# FG_TEST_REDIS_CLUSTER=1: REDIS_URL names a local Redis Cluster (3 primaries + 3 replicas) and
# RQ_REDIS_URL a single redis-server beside it, as in a cluster deployment. The tests below
# cannot apply to that run; it skips them, saying why.
CLUSTER = os.environ.get("FG_TEST_REDIS_CLUSTER") == "1"
_RQ_ON_DB_INDEX = (
    "settlement runs on RQ_REDIS_URL, a single Redis in every deployment; this test "
    "isolates its queue in a database index of redis_server, which a cluster node lacks"
)
_SCHEDULER_ON_DB_INDEX = (
    "rq-scheduler runs on RQ_REDIS_URL, a single Redis in every deployment; this test gives it a "
    "database index of redis_server, which a cluster node lacks"
)
_RQ_ON_REDIS_SERVER = (
    "RQ runs on RQ_REDIS_URL, a single Redis in every deployment; this test enqueues its jobs on "
    "redis_server, a cluster node in this run"
)
_SETTLEMENT = "tests/leads/path/test_settlement.py::"
NOT_ON_CLUSTER = {
    "tests/caps/test_reconcile.py::test_scheduler_started_twice_schedules_each_periodic_job_once": (
        _SCHEDULER_ON_DB_INDEX
    ),
    _SETTLEMENT + "test_a_drain_job_run_twice_settles_once": _RQ_ON_DB_INDEX,
    _SETTLEMENT + "test_database_outage_is_retried_and_settles_after_it_returns": _RQ_ON_DB_INDEX,
    _SETTLEMENT + "test_worker_killed_mid_settlement_is_run_again_and_settles_exactly_once": _RQ_ON_DB_INDEX,
    _SETTLEMENT + "test_failed_settlement_job_is_requeued_by_the_cli": _RQ_ON_DB_INDEX,
    **{
        f"tests/storage/live/test_batch.py::{name}": "counts the writes of one connection to one redis-server"
        for name in (
            "test_a_lead_sold_at_its_first_buyer_costs_two_round_trips",
            "test_each_further_buyer_costs_a_reservation_and_a_refund",
            "test_a_replay_gives_back_the_reservation_made_with_its_claim",
        )
    },
    "tests/test_cli.py::test_settlements_status_and_requeue_of_failed_jobs": _RQ_ON_REDIS_SERVER,
}


# FG_TEST_GALERA=1: DATABASE_URL names HAProxy in front of a local MariaDB Galera cluster of three
# nodes (testkit/galera.py), one writer at a time, as in a deployment with the ledger on a cluster
# (API.md "The ledger on a cluster").
GALERA = os.environ.get("FG_TEST_GALERA") == "1"
GALERA_PROXY_ENV = "FG_TEST_GALERA_PROXY"  # the cluster's admin URL through HAProxy, set by pytest_configure
GALERA_KEY = pytest.StashKey[GaleraCluster]()

# FG_TEST_SQLITE=1: the ledger on SQLite even when MariaDB answers, as the embedded default runs
# (.ci/run's sqlite lane). Tests that need MySQL skip, saying so.
SQLITE = os.environ.get("FG_TEST_SQLITE") == "1"


def pytest_report_header(config) -> list[str]:
    return [
        "redis: "
        + ("a local cluster, 3 primaries + 3 replicas (FG_TEST_REDIS_CLUSTER=1)" if CLUSTER else "one redis-server"),
        "database: "
        + (
            "a local Galera cluster of 3 behind HAProxy (FG_TEST_GALERA=1)"
            if GALERA
            else "SQLite (FG_TEST_SQLITE=1)"
            if SQLITE
            else "MariaDB/MySQL or SQLite"
        ),
    ]


# A test is of the multi-process tier (marker `e2e`) when it uses one of these fixtures, or
# carries the marker itself (it starts processes of its own, kills them, or needs gevent).
E2E_FIXTURES = {"web", "web_api", "second_web", "metrics_web", "cluster", "chromium"}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if E2E_FIXTURES & set(getattr(item, "fixturenames", ())) or item.nodeid.startswith("tests/e2e/"):
            item.add_marker(pytest.mark.e2e)
    if CLUSTER:
        for item in items:
            if item.nodeid in NOT_ON_CLUSTER:
                item.add_marker(pytest.mark.skip(reason="cluster run: " + NOT_ON_CLUSTER[item.nodeid]))


@pytest.fixture(scope="session", autouse=True)
def loopback_partners() -> None:
    """The outbound clients of this process reach the partners the tests run on 127.0.0.1, as
    the app's (LOOPBACK_PARTNERS in base_env) do; tests of refusals build their own DenyList."""
    outbound.configure(targets.DEFAULT_DENY_NETS, allow_loopback=True)


@pytest.fixture(scope="session")
def tmp_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("floodgate")


@pytest.fixture(scope="session")
def redis_server(tmp_root):
    """The Redis of caps, leases, claims and breakers (REDIS_URL): see CLUSTER."""
    server = LocalCluster(tmp_root / "cluster") if CLUSTER else RedisServer(tmp_root / "redis")
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def queue_server(tmp_root, redis_server):
    """The Redis of RQ and the settlement lists: redis_server, or beside a cluster a
    redis-server of its own (RQ_REDIS_URL), as RQ cannot use a cluster."""
    if not CLUSTER:
        testkit_payments.QUEUE_URL = redis_server.url
        yield redis_server
        return
    server = RedisServer(tmp_root / "queue-redis")
    server.start()
    testkit_payments.QUEUE_URL = server.url
    yield server
    server.kill()


def pytest_configure(config) -> None:
    """With GALERA, one cluster for the run, started here by the process that runs the tests or,
    under xdist, by the controller before it starts its workers: three nodes for each worker
    would be more than two cores carry. The workers find its proxy in GALERA_PROXY_ENV (they
    inherit the environment); the controller stops it in pytest_unconfigure."""
    if not GALERA or hasattr(config, "workerinput") or GALERA_PROXY_ENV in os.environ:  # set: a cluster of the caller's
        return
    capture = config.pluginmanager.getplugin("capturemanager")

    def echo(line: str) -> None:  # the start takes about 20 s: a line per node as it joins
        with capture.global_and_fixture_disabled():
            print(line, flush=True)  # noqa: T201

    cluster = GaleraCluster(echo=echo)
    config.stash[GALERA_KEY] = cluster
    cluster.start()
    os.environ[GALERA_PROXY_ENV] = cluster.proxy_url


def pytest_unconfigure(config) -> None:
    cluster = config.stash.get(GALERA_KEY, None)
    if cluster is not None:
        os.environ.pop(GALERA_PROXY_ENV, None)
        cluster.stop()


@pytest.fixture(scope="session")
def database_url(tmp_root):
    admin = os.environ[GALERA_PROXY_ENV] if GALERA else None if SQLITE else mysql_admin_url()
    if admin:
        url, drop = create_mysql_db(admin)
    else:
        url, drop = f"sqlite:///{tmp_root / 'ledger.sqlite3'}", (lambda: None)
    init_db(url, pool_size=4)
    upgrade(echo=lambda _m: None)
    yield url
    db.close()
    drop()


@pytest.fixture
def refused_redis():
    """A client of a Redis that refuses every connection: its port is bound and never listened
    on while the test runs."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        yield redis.Redis(port=taken.getsockname()[1], socket_connect_timeout=0.5)


@pytest.fixture
def database_down(tmp_path, database_url):
    """`with database_down():` the ledger is unreachable (bound to a path that cannot be
    opened), then bound again as `database_url` binds it."""

    @contextmanager
    def down() -> Iterator[None]:
        init_db(f"sqlite:///{tmp_path / 'absent' / 'ledger.sqlite3'}")
        try:
            yield
        finally:
            init_db(database_url, pool_size=4)

    return down


@pytest.fixture(scope="session")
def base_env(redis_server, queue_server, database_url, tmp_root) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAYSTACK", "STRIPE", "MONNIFY", "FLUTTERWAVE"))}
    env.update(SECRETS)
    env.update(NO_PROVIDER_APIS)
    env.update(LOOPBACK_PARTNERS)
    env.update(
        {
            "REDIS_URL": redis_server.url,
            "DATABASE_URL": database_url,
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "CONFIG_CHECK_INTERVAL_MS": "100",
            "JOURNAL_KEEP_S": "30",
            "BREAKER_FAILURES": "3",
            "BREAKER_COOLDOWN_MS": "1500",
            "DB_POOL_SIZE": "8",
            "PYTHONUNBUFFERED": "1",
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_root / "prometheus"),
            "OPS_INSECURE_COOKIE": "1",  # the test servers speak plain HTTP (test_ops_session checks Secure)
            # bursts of 1,000 leads from one publisher; tests/leads/rules/test_publishers.py turns the default on
            "PUBLISHER_RATE_LIMIT": "off",
        }
    )
    if queue_server is not redis_server:
        env["RQ_REDIS_URL"] = queue_server.url
    return env


@pytest.fixture(scope="session")
def web(base_env, tmp_root):
    """The app under gunicorn + gevent, two worker processes."""
    server = WebServer(base_env, tmp_root / "web.log", workers=2)
    yield server
    server.stop()


class Worker:
    """The run's RQ worker (non-forking, with the scheduler for retries). An RQ worker quits
    when its Redis disappears under a running job, as some tests make it do: `ensure` starts
    a new one after a restart of that Redis, as a process manager would."""

    def __init__(self, env: dict, log_dir: Path, queue_server: RedisServer):
        self.env, self.log_dir, self.redis = env, log_dir, queue_server
        self.proc, self.starts, self.generation = None, 0, None

    def ensure(self) -> Proc:
        if self.proc is not None and (not self.proc.alive() or self.generation != self.redis.generation):
            self.proc.stop()
            self.proc = None
        if self.proc is None:
            self.starts += 1
            self.generation = self.redis.generation
            url = self.env.get("RQ_REDIS_URL") or self.env["REDIS_URL"]
            self.proc = Proc(
                [
                    venv_bin("rq"),
                    "worker",
                    "--url",
                    url,
                    "--with-scheduler",
                    "-w",
                    "rq.worker.SimpleWorker",
                    "floodgate",
                    "floodgate-events",  # one process for both here (production: one each)
                ],
                self.env,
                self.log_dir / f"worker{self.starts}.log",
            )
        return self.proc

    def stop(self) -> None:
        if self.proc:
            self.proc.stop()


@pytest.fixture(scope="session")
def worker_manager(base_env, tmp_root, queue_server):
    manager = Worker(base_env, tmp_root, queue_server)
    yield manager
    manager.stop()


@pytest.fixture
def worker(worker_manager):
    return worker_manager.ensure()


@pytest.fixture(scope="session")
def buyer_server():
    server = BuyerServer()
    yield server
    server.close()


def _let_the_worker_finish(queue: RedisServer, timeout_s: float = 10.0) -> None:
    """The run's RQ worker (session-wide, started by an earlier test) may be writing a batch an
    earlier test queued: its rows would land in the ledger after it is emptied (a publisher
    the next test creates would then not be fresh, and its first lead wait as after a Redis
    loss). First nothing is left to start or take: the queues and the pending lists are
    emptied. A batch a job took before that is in its processing list (lua/take_batch.lua
    moves it there in one step), so waiting while a running job holds one covers every batch
    in flight (a failed job's batch stays, for its retry: not waited for). Waiting for the
    job itself would cost about a second a test: a drain job lingers for more. Likewise an
    events drain (it holds the events lock while it runs): it would fan out and deliver the
    next test's events with the worker's settings."""
    client = redis.Redis.from_url(queue.url)
    try:
        queue.delete_keys("rq:queue:*")
        client.delete(keys.SETTLE_PENDING, keys.WEBHOOK_CALLS_PENDING)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            held = [
                key.decode().rsplit(":", 1)[1]
                for pattern in (keys.settle_processing("*"), keys.webhook_calls_processing("*"))
                for key in client.scan_iter(match=pattern, count=1000)
            ]
            running = [j for j in held if client.hget(f"rq:job:{j}", "status") == b"started"]
            if not running and not client.exists(keys.OUTBOX_LOCK):
                return
            time.sleep(0.02)
    finally:
        client.close()


@pytest.fixture(autouse=True)
def clean(request):
    """Each test starts with an empty ledger, no Floodgate keys in Redis and no queued job."""
    if "redis_server" in request.fixturenames or "web" in request.fixturenames:
        main, queue = request.getfixturevalue("redis_server"), request.getfixturevalue("queue_server")
        if queue.alive():
            _let_the_worker_finish(queue)
        for server in (main, queue) if queue is not main else (main,):
            if not server.alive():
                server.start()
            # emptying keys between tests is not a Redis data loss: the epoch stays
            server.delete_keys(keys.PREFIX + "*", keep=(keys.EPOCH,))
        # nor a job an earlier test queued and no worker ran: under xdist the tests before this
        # one are not those of a serial run (a worker started by one of those drained them).
        # Again after _let_the_worker_finish emptied them: a drain waited for may hand over to
        # a new job as it ends, and a Redis started just now was not emptied there.
        queue.delete_keys("rq:queue:*")
    if "database_url" in request.fixturenames or "web" in request.fixturenames:
        request.getfixturevalue("database_url")
        with db.connection_context():
            for model in ALL_MODELS:
                if model is not SchemaMigration:
                    model.delete().execute()
    if "buyer_server" in request.fixturenames:
        request.getfixturevalue("buyer_server").reset()
    if "app" in request.fixturenames:
        # the in-process app's memory of earlier tests: their settlements and config
        app = request.getfixturevalue("app")
        services.of(app).journal.clear()
        services.of(app).catalog.invalidate()
    yield


class InProcess(requests.adapters.BaseAdapter):
    """A requests transport that hands each request to the Flask app in this process (its
    test client), so a test reads the same whether it talks to gunicorn or to the app here."""

    def __init__(self, app):
        super().__init__()
        self.app = app

    def send(self, request, **_kw) -> requests.Response:
        url = urlsplit(request.url)
        body = request.body
        if body is not None and not isinstance(body, (bytes, str)):
            # A generator: a chunked upload. The app sees it as a WSGI server passes one on,
            # without CONTENT_LENGTH, its stream terminated by the server (gunicorn's way).
            kw = {
                "input_stream": io.BytesIO(b"".join(body)),
                "environ_overrides": {"CONTENT_LENGTH": "", "wsgi.input_terminated": True},
            }
        else:
            kw = {"data": body}
        client = self.app.test_client(use_cookies=False)  # a jar of its own would drop the Cookie header
        got = client.open(
            url.path, query_string=url.query, method=request.method, headers=list(request.headers.items()), **kw
        )
        resp = requests.Response()
        resp.status_code, resp.url, resp.request = got.status_code, request.url, request
        resp.headers = requests.structures.CaseInsensitiveDict(got.headers.items())
        resp._content = got.get_data()
        resp.encoding = "utf-8"
        resp.reason = got.status.split(" ", 1)[-1]
        return resp

    def close(self) -> None:
        pass


class Api:
    """A thin client of the HTTP contract, for tests: of a server at `base_url`, or with `app`
    of the app in this process (then `base_url` is only a name)."""

    def __init__(self, base_url: str, app=None):
        self.base = base_url
        self.app = app
        self.http = self.session()
        self.admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def session(self) -> requests.Session:
        """A new client session (one per thread in concurrency tests)."""
        s = requests.Session()
        if self.app is not None:
            s.mount(self.base, InProcess(self.app))
        else:  # no idle keep-alive connection left to hold gunicorn's graceful stop (keepalive 5 s)
            s.headers["Connection"] = "close"
        return s

    def put_publisher(self, pid: str, api_key: str | None = None, **fields) -> str:
        api_key = api_key or f"pk_test_{pid}_0123456789"
        body = {"name": pid.title(), "api_key": api_key, **fields}
        resp = self.http.put(f"{self.base}/v1/admin/publishers/{pid}", json=body, headers=self.admin)
        assert resp.status_code == 200, resp.text
        return api_key

    def put_buyer(self, bid: str, endpoint_url: str, **fields) -> dict:
        body = {
            "name": bid.title(),
            "endpoint_url": endpoint_url,
            "priority": 1,
            "price": "10.00",
            "timezone": "UTC",
            **fields,
        }
        resp = self.http.put(f"{self.base}/v1/admin/buyers/{bid}", json=body, headers=self.admin)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def get(self, path: str, **kw) -> requests.Response:
        return self.http.get(self.base + path, headers=self.admin, **kw)

    def post_lead(self, api_key: str, body: dict, session: requests.Session | None = None):
        return (session or self.http).post(
            f"{self.base}/v1/leads", json=body, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
        )

    def settle_config(self) -> None:
        """Let every web process pick up the admin changes just made: the app in this process
        reads the config version on its next lead; separate processes get the time they need
        (CONFIG_CHECK_INTERVAL_MS, below)."""
        if self.app is not None:
            services.of(self.app).catalog.invalidate()
        else:
            time.sleep(CONFIG_SETTLE_S)

    def wait_settled(self, lead_id: str, publisher_id: str, timeout: float = 15) -> dict:
        def settled():
            resp = self.get(f"/v1/admin/leads/{lead_id}", params={"publisher_id": publisher_id})
            return resp.json() if resp.status_code == 200 else None

        return wait_until(settled, timeout=timeout, what=f"lead {lead_id} settled")


@pytest.fixture(scope="session")
def app(base_env):
    """The app in this process, on the run's Redis and database (the fast tier)."""
    from webhooks import config, create_app

    return create_app(config.load(base_env))


@pytest.fixture
def api(app, redis_server, database_url):
    client = Api(IN_PROCESS_URL, app)
    yield client
    client.http.close()


@pytest.fixture
def engine_lock(app, redis_server):
    """Hold the events worker's lock for the test, so that its engine runs in this process only
    (testkit.events.deliver_inline): an RQ worker of the session would wait for it, then leave
    (and would fan events out with its own configuration, not the test's)."""
    from webhooks.storage.live import claims

    store = services.of(app).queue_redis
    wait_until(lambda: claims.claim(store, keys.OUTBOX_LOCK, 120_000)[0], timeout=15, what="the events lock")
    yield
    store.redis.delete(keys.OUTBOX_LOCK)


@pytest.fixture
def reconfigure(app):
    """Run the in-process app with some Config fields changed, as a different environment
    would set them (read per request), for one test: `reconfigure(flutterwave_verify=True)`."""
    svc = services.of(app)
    original = svc.config

    def change(**fields):
        svc.reconfigure(dataclasses.replace(original, **fields))

    yield change
    svc.reconfigure(original)


@pytest.fixture
def web_api(web):
    """The same client of the app under gunicorn + gevent (e2e tests); its pooled connections
    closed after the test (left open, a ResourceWarning at exit fails the run)."""
    client = Api(web.url)
    yield client
    client.http.close()
