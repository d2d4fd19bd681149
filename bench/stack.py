"""The processes a benchmark measures, set up once and torn down by an ExitStack: a private
redis-server, a throw-away MariaDB database (or SQLite where none answers), the schema, and
the environment Floodgate's processes run with; then, as a bench needs them, gunicorn, the RQ
worker and the buyer stub (testkit/buyer_stub.py). `Stack` is the whole set the end-to-end
benches share (knee, versus, levers, profile), with the bare endpoint beside it, and wrk and
CPU accounting to drive and charge it. The one set-up of bench/.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import requests

from bench.common import QUICK
from testkit.config import LOOPBACK_PARTNERS, NO_PROVIDER_APIS
from testkit.payments import encode, payload, signed_headers
from testkit.servers import (
    Proc,
    RedisServer,
    WebServer,
    create_mysql_db,
    free_port,
    listening,
    mysql_admin_url,
    venv_bin,
    wait_until,
)
from webhooks.storage.live import keys

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "bench-admin-token-0123456789"
API_KEY = "pk_bench_0123456789abcdef"
BIG = 10**9


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
    es: ExitStack,
    tmp: Path,
    extra_env: dict | None = None,
    *,
    mysql_only: bool = False,
    code: Path = ROOT,
    db: str = "",
) -> Base:
    """Redis and a database with the schema applied (by `code`'s `flask db upgrade`), and the
    environment: the admin token, no default publisher rate limit (benches send thousands of
    leads a second from one publisher), a metrics directory of the run's own. `db`: a database
    of the caller's (bench/pages.py keeps a loaded one), else a throw-away one."""
    server = redis(es, tmp)
    db_url = db or database(es, tmp, mysql_only=mysql_only)
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


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def network(buyer_url: str) -> list[tuple[str, dict]]:
    """The admin PUTs (path, body) of the benches' network: the publisher Bench (API_KEY) and
    the buyer Acme at `buyer_url`, its caps out of reach."""
    caps = {"hourly": BIG, "daily": BIG, "weekly": BIG, "monthly": BIG, "daily_budget": "999999999.00"}
    return [
        ("/v1/admin/publishers/bench", {"name": "Bench", "api_key": API_KEY, "commission_pct": "10"}),
        (
            "/v1/admin/buyers/acme",
            {"name": "Acme", "endpoint_url": buyer_url, "price": "12.50", "caps": caps, "timezone": "America/Chicago"},
        ),
    ]


class Stack:
    """Every process of an end-to-end run: Redis, the database, the buyer stub, Floodgate (2
    gunicorn workers), its RQ worker, and the bare endpoint (bench/bare_app.py) on the same
    gunicorn settings, the ceiling the lead path is compared with."""

    def __init__(self, es: ExitStack, tmp: Path, extra_env: dict | None = None, code: Path = ROOT):
        self.base = base(es, tmp, extra_env, code=code)
        self.redis, self.db_url, env = self.base.redis, self.base.db_url, self.base.env
        self.buyer, buyer_url = self.base.buyer_stub(es)
        self.web = self.base.web(es, workers=2)
        self.worker = self.base.worker(es)
        self.bare_port = free_port()
        self.bare = Proc(
            [venv_bin("gunicorn"), "-c", "gunicorn.conf.py", "bench.bare_app:app"],
            {**env, "PORT": str(self.bare_port), "WEB_CONCURRENCY": "2"},
            tmp / "bare.log",
        )
        es.callback(self.bare.stop)
        self.bare_url = f"http://127.0.0.1:{self.bare_port}"
        self._configure(buyer_url)

    def _configure(self, buyer_url: str) -> None:
        h = {"Authorization": f"Bearer {ADMIN}"}
        for path, body in network(buyer_url):
            requests.put(f"{self.web.url}{path}", headers=h, timeout=10, json=body).raise_for_status()
        time.sleep(1.2)  # every web process has the config

        def lead(url: str) -> requests.Response:
            return requests.post(
                url + "/v1/leads", json={"state": "TX"}, timeout=10, headers={"Authorization": f"Bearer {API_KEY}"}
            )

        wait_until(lambda: listening(self.bare_port), timeout=60, what="bare app")  # a loaded machine: seconds
        wait_until(lambda: lead(self.bare_url).status_code == 200, timeout=30, what="bare app")
        answer = lead(self.web.url).json()
        if answer.get("status") != "sold":
            raise SystemExit(f"the stack does not sell: {answer}")

    def pids(self) -> dict[str, list[int]]:
        """Processes whose CPU time a run is charged with."""
        return {
            "web (2 gunicorn workers)": tree(self.web.pid),
            "rq worker": tree(self.worker.pid),
            "redis-server": [self.redis.proc.pid],
            "buyer stub": [self.buyer.pid],
            "mariadbd": mariadbd(),
        }


def tree(pid: int) -> list[int]:
    """`pid` and its children (gunicorn's master, then its workers)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [pid] + [int(p) for p in out.split()]


def mariadbd() -> list[int]:
    return [int(p) for p in subprocess.run(["pgrep", "-x", "mariadbd"], capture_output=True, text=True).stdout.split()]


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
        except (OSError, IndexError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def drained(stack: Stack) -> float:
    """Seconds until both queues (settlements, delivery audit rows) are empty."""
    t0, r = time.monotonic(), stack.redis.client()
    wait_until(
        lambda: r.llen(keys.SETTLE_PENDING) == 0 and r.llen(keys.WEBHOOK_CALLS_PENDING) == 0,
        timeout=180,
        interval=0.2,
        what="both queues drained",
    )
    return round(time.monotonic() - t0, 2)


def warm(url: str, connections: int, tag: str) -> None:
    """A 2 s wrk run before measuring; none in a quick run (bench/common.py QUICK)."""
    if not QUICK:
        wrk(url, connections, 2, tag)


def _wrk(url: str, connections: int, seconds: int, script: str, args: list[str]) -> dict:
    """wrk with bench/<script> (which prints one `JSON {...}` line), summarised."""
    threads = min(2, connections)
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s"]
    command += ["-s", str(ROOT / "bench" / script), url, "--", *args]
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    data = json.loads(next(line for line in out.splitlines() if line.startswith("JSON "))[5:])
    return {
        "rps": round(data["requests"] / (data["duration_us"] / 1e6), 1),
        "requests": data["requests"],
        "errors": sum(data["errors"].values()),
        "p50_ms": data["p50_us"] / 1000,
        "p95_ms": data["p95_us"] / 1000,
        "p99_ms": data["p99_us"] / 1000,
    }


def wrk(url: str, connections: int, seconds: int, tag: str) -> dict:
    """Leads (bench/lead.lua) from publisher Bench, `lead_id`s tagged with `tag`."""
    return _wrk(url, connections, seconds, "lead.lua", [tag, API_KEY])


def wrk_payments(url: str, listing: Path, connections: int, seconds: int) -> dict:
    """Payment deliveries (bench/pay.lua) from the Lua file `listing` (lua_list)."""
    result = _wrk(url, connections, seconds, "pay.lua", [str(listing), str(min(2, connections))])
    result["non_2xx_or_errors"] = result.pop("errors")
    return result


def lua_list(deliveries: list, path: Path) -> None:
    """bench/pay.lua's input: a Lua file returning {{path, headers, body}, ...}."""

    def s(text: str) -> str:
        return "[==[" + text + "]==]"

    lines = ["return {"]
    for provider, headers, body in deliveries:
        h = ", ".join(f"[ {s(k)} ] = {s(v)}" for k, v in {"Content-Type": "application/json", **headers}.items())
        lines.append(f"  {{{s('/v1/webhooks/' + provider)}, {{{h}}}, {s(body)}}},")
    lines.append("}")
    path.write_text("\n".join(lines))


def first_deliveries(tag: str, payments: int, rng: random.Random, payers: int = 500) -> list:
    """The `first` mix: Paystack payments (HMAC-SHA512) of `payers` payers, each signed once and
    sent 5 times, all shuffled: the start of the list is mostly each payment's first delivery."""
    out = []
    for i in range(payments):
        amount, email = rng.randint(100, 50_000_000), f"{tag}-p{rng.randrange(payers)}@x.io"
        raw = encode(payload("paystack", f"{tag}-{i}", amount, "NGN", email))
        out += [("paystack", signed_headers("paystack", raw), raw.decode())] * 5
    rng.shuffle(out)
    return out
