"""The processes a benchmark measures, set up once and torn down by an ExitStack: a private
redis-server, a throw-away MariaDB database (or SQLite where none answers), the schema, and
the environment Floodgate's processes run with; then, as a bench needs them, gunicorn, the RQ
worker and the buyer stub (testkit/buyer_stub.py). The one set-up of bench/: the cluster
failover builds its three Redis backends side by side from redis() and database().
"""

from __future__ import annotations

import os
import subprocess
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from testkit.config import LOOPBACK_PARTNERS, NO_PROVIDER_APIS
from testkit.servers import Proc, RedisServer, WebServer, create_mysql_db, free_port, mysql_admin_url, venv_bin

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "bench-admin-token-0123456789"


@dataclass
class Base:
    """Redis, a database with the schema, and the environment of every Floodgate process."""

    redis: RedisServer
    db_url: str
    env: dict[str, str]
    tmp: Path
    code: Path = ROOT  # the checkout whose processes run (bench/levers.py: another revision)

    def web(self, es: ExitStack, workers: int = 2, extra_env: dict | None = None, name: str = "web") -> WebServer:
        """gunicorn with `workers` gevent workers on a free port, stopped with `es`."""
        web = WebServer({**self.env, **(extra_env or {})}, self.tmp / f"{name}.log", workers=workers, cwd=self.code)
        es.callback(web.stop)
        return web

    def worker(self, es: ExitStack, extra_env: dict | None = None, scheduler: bool = True) -> Proc:
        """The Procfile's RQ worker (non-forking), stopped with `es`."""
        args = [
            venv_bin("rq"),
            "worker",
            "--url",
            self.redis.url,
            "-w",
            "rq.worker.SimpleWorker",
            "-q",
            "floodgate",
            "floodgate-events",
        ]
        if scheduler:
            args.insert(4, "--with-scheduler")
        worker = Proc(args, {**self.env, **(extra_env or {})}, self.tmp / "worker.log", self.code)
        es.callback(worker.stop)
        return worker

    def buyer_stub(self, es: ExitStack) -> tuple[Proc, str]:
        """testkit/buyer_stub.py on a free port: its process and the URL of its buyer `acme`."""
        port = free_port()
        stub = Proc([venv_bin("python"), "-m", "testkit.buyer_stub", str(port)], self.env, self.tmp / "buyer.log")
        es.callback(stub.stop)
        return stub, f"http://127.0.0.1:{port}/acme"


def database(es: ExitStack, tmp: Path, *, mysql_only: bool = False) -> str:
    """A throw-away MariaDB/MySQL database (dropped with `es`), else an SQLite file under `tmp`."""
    admin = mysql_admin_url()
    if admin:
        url, drop = create_mysql_db(admin)
        es.callback(drop)
        return url
    if mysql_only:
        raise SystemExit("MariaDB/MySQL is not reachable (FG_TEST_MYSQL): this bench measures the MySQL path")
    return f"sqlite:///{tmp / 'ledger.sqlite3'}"


def redis(es: ExitStack, tmp: Path, name: str = "redis") -> RedisServer:
    server = RedisServer(tmp / name)
    server.start()
    es.callback(server.kill)
    return server


def base(
    es: ExitStack, tmp: Path, extra_env: dict | None = None, *, mysql_only: bool = False, code: Path = ROOT
) -> Base:
    """Redis and a database with the schema applied (by `code`'s `flask db upgrade`), and the
    environment: the admin token, no default publisher rate limit (benches send thousands of
    leads a second from one publisher), a metrics directory of the run's own."""
    server = redis(es, tmp)
    db_url = database(es, tmp, mysql_only=mysql_only)
    (tmp / "prometheus").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "REDIS_URL": server.url,
        "DATABASE_URL": db_url,
        "ADMIN_TOKEN": ADMIN,
        "PYTHONUNBUFFERED": "1",
        "PUBLISHER_RATE_LIMIT": "off",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp / "prometheus"),
        **NO_PROVIDER_APIS,
        **LOOPBACK_PARTNERS,
        **(extra_env or {}),
    }
    subprocess.run(
        [venv_bin("flask"), "--app", "wsgi", "db", "upgrade"], env=env, cwd=code, check=True, capture_output=True
    )
    return Base(server, db_url, env, tmp, code)
