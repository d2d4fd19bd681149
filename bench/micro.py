"""Per-call costs of the levers measured outside the stack: what a candidate would save per
request, each against its alternative in the same process, alternated, medians of 3.

- the HTTP client of a buyer post under gevent: urllib3's pool (requests' adapter) against
  geventhttpclient, 25 greenlets posting to testkit/buyer_stub.py answering at once;
- JSON: the standard library against orjson, on the shapes a lead encodes and decodes;
- prometheus-client: a counter and a histogram in multiprocess mode (mmap files, as the web
  workers run) against one process's memory;
- `gevent.Timeout` around a call (the buyer post's hard deadline);
- a Lua script in a pipeline sent as EVAL (its text, ~3 KB) against EVALSHA;
- the check redis-py's pool makes on every checkout (webhooks/storage/redis.py `Connection`):
  redis-py's own, with and without its maintenance notifications, against one poll(2);
- a credit's transaction on MariaDB as two round trips (the balance read back from the
  wallet's upsert) against one, the event's INSERT reading the balance from the wallet's row
  (INSERT ... SELECT) or computing it from what the upsert left (ledger.top_up), with MariaDB's
  CPU per credit.

    python -m bench.micro      ->  bench/out/micro.json, micro.md
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path

import gevent

ROOT = Path(__file__).resolve().parent.parent

from bench.common import OUT, machine_info, write_json, write_md
from bench.e2e import log
from testkit.servers import RedisServer, free_port, listening, venv_bin, wait_until

ROUNDS = 3
SCALE = 1  # --quick: every count divided by 50, one round (does it still run?)
LEAD = {"email": "ada@example.com", "phone": "+2348030000000", "state": "CA", "zip": "94107", "age": 33}
ITEM = {
    "publisher_id": "pub-1",
    "lead_id": "x-2-320",
    "status": "sold",
    "buyer_id": "acme",
    "price": "12.50",
    "attempts": [{"buyer_id": "acme", "outcome": "accepted", "ms": 21, "at": "2026-12-02T06:00:00.123+00:00"}],
    "received_at": "2026-12-02T06:00:00.100+00:00",
    "request_id": "e93d457436a2449f9164eadf4c56f03e",
    "payload": LEAD,
}
ANSWER = {"lead_id": "x-2-320", "status": "sold", "buyer_id": "acme", "price": "12.50"}


def per_call_us(fn: Callable[[], object], number: int) -> float:
    number = max(1, number // SCALE)
    return timeit.timeit(fn, number=number) / number * 1e6


def alternated(arms: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Each arm's median over ROUNDS, the arms taking turns."""
    runs: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(ROUNDS):
        for name, arm in arms.items():
            runs[name].append(arm())
    return {name: round(statistics.median(values), 2) for name, values in runs.items()}


def http_clients() -> dict[str, float]:
    """CPU µs per buyer post (process CPU time over 6,000 posts by 25 greenlets)."""
    import urllib3
    from geventhttpclient import HTTPClient
    from requests.adapters import HTTPAdapter

    port = free_port()
    buyer = subprocess.Popen(
        [venv_bin("python"), str(ROOT / "testkit" / "buyer_stub.py"), str(port)],
        env={**os.environ, "BUYER_DELAY_MS": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        body = json.dumps(LEAD).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), "User-Agent": "Floodgate/1"}
        pool = HTTPAdapter(pool_connections=100, pool_maxsize=100, max_retries=0).poolmanager.connection_from_url(
            f"http://127.0.0.1:{port}/"
        )
        timeout = urllib3.Timeout(connect=2, read=2)
        client = HTTPClient("127.0.0.1", port=port, concurrency=100, connection_timeout=2, network_timeout=2)

        def urllib3_post() -> None:
            with gevent.Timeout(2):
                resp = pool.urlopen(
                    "POST", "/acme", body=body, headers=headers, retries=False, redirect=False, preload_content=False,
                    timeout=timeout,
                )  # fmt: skip
                resp.read(65537)
                resp.release_conn()

        def geventhttpclient_post() -> None:
            with gevent.Timeout(2):
                resp = client.request("POST", "/acme", body=body, headers=headers)
                resp.read(65537)
                resp.release()

        wait_until(lambda: listening(port), timeout=10, what="buyer stub")

        def cpu_per_post(post: Callable[[], None], n: int = 6000, greenlets: int = 25) -> float:
            n = max(greenlets, n // SCALE)
            started = time.process_time()
            gevent.joinall([gevent.spawn(lambda: [post() for _ in range(n // greenlets)]) for _ in range(greenlets)])
            return (time.process_time() - started) / n * 1e6

        return alternated(
            {
                "urllib3 (requests' adapter pool)": lambda: cpu_per_post(urllib3_post),
                "geventhttpclient": lambda: cpu_per_post(geventhttpclient_post),
            }
        )
    finally:
        buyer.terminate()
        buyer.wait()


def json_libraries() -> dict[str, float]:
    import orjson

    raw = json.dumps(LEAD)
    n = 50_000
    return alternated(
        {
            "json.dumps (settlement item)": lambda: per_call_us(lambda: json.dumps(ITEM), n),
            "orjson.dumps (settlement item)": lambda: per_call_us(lambda: orjson.dumps(ITEM), n),
            "json.dumps (answer)": lambda: per_call_us(lambda: json.dumps(ANSWER), n),
            "orjson.dumps (answer)": lambda: per_call_us(lambda: orjson.dumps(ANSWER), n),
            "json.loads (lead)": lambda: per_call_us(lambda: json.loads(raw), n),
            "orjson.loads (lead)": lambda: per_call_us(lambda: orjson.loads(raw), n),
        }
    )


PROMETHEUS_CHILD = """
import json, timeit
from prometheus_client import Counter, Histogram
c, h = Counter("x_total", "x", ["a"]), Histogram("y_seconds", "y", ["a"])
n = 50_000
print(json.dumps([timeit.timeit(lambda: c.labels("sold").inc(), number=n) / n * 1e6,
                  timeit.timeit(lambda: h.labels("sold").observe(0.02), number=n) / n * 1e6]))
"""


def prometheus() -> dict[str, float]:
    """A counter's inc and a histogram's observe, each mode in a process of its own (the mode is
    chosen when prometheus-client is imported)."""

    def measure(multiprocess: bool) -> list[float]:
        with tempfile.TemporaryDirectory() as folder:
            env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
            if multiprocess:
                env["PROMETHEUS_MULTIPROC_DIR"] = folder
            out = subprocess.run([sys.executable, "-c", PROMETHEUS_CHILD], env=env, capture_output=True, text=True)
            return json.loads(out.stdout)

    runs: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for mode in (True, False):
            inc, observe = measure(mode)
            name = "multiprocess" if mode else "one process"
            runs.setdefault(f"counter inc, {name}", []).append(inc)
            runs.setdefault(f"histogram observe, {name}", []).append(observe)
    return {name: round(statistics.median(v), 2) for name, v in runs.items()}


def timeout() -> dict[str, float]:
    def with_timeout() -> None:
        with gevent.Timeout(2.0):
            pass

    return alternated({"gevent.Timeout around a call": lambda: per_call_us(with_timeout, 100_000)})


def eval_or_evalsha(workdir: Path) -> dict[str, float]:
    """Client CPU µs and Redis CPU µs per pipeline of one script call, its text sent each time
    (EVAL) or its SHA1 (EVALSHA); a script of lua/claim_lead.lua's size that does nothing."""
    server = RedisServer(workdir / "redis")
    server.start()
    try:
        r = server.client()
        script = "-- " + "x" * 2800 + "\nreturn 1"
        sha = r.script_load(script)

        def redis_cpu() -> float:
            info = r.info("cpu")
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

        def run(command: str, body: str, n: int = 20_000) -> tuple[float, float]:
            n = max(1, n // SCALE)
            server_before, client_before = redis_cpu(), time.process_time()
            for _ in range(n):
                pipe = r.pipeline(transaction=False)
                pipe.execute_command(command, body, 2, "a{x}", "b{x}", "1", "2")
                pipe.execute()
            return (time.process_time() - client_before) / n * 1e6, (redis_cpu() - server_before) / n * 1e6

        runs: dict[str, list[float]] = {}
        for _ in range(ROUNDS):
            for command, body in (("EVAL", script), ("EVALSHA", sha)):
                client, redis_side = run(command, body)
                runs.setdefault(f"{command}: client", []).append(client)
                runs.setdefault(f"{command}: redis-server", []).append(redis_side)
        return {name: round(statistics.median(v), 2) for name, v in runs.items()}
    finally:
        server.kill()


def redis_checkout(workdir: Path) -> dict[str, float]:
    """Client CPU µs per script call (EVALSHA) and per pipeline of two commands under gevent,
    by how the pool checks a connection it hands out: redis-py 8's own with its maintenance
    notifications on (its default: the check is made, then not acted on), redis-py's own with
    them off (made and acted on, through gevent's `select.poll`), and make_redis's (poll(2))."""
    import redis
    from redis.maint_notifications import MaintNotificationsConfig

    from webhooks.storage.redis import make_redis

    server = RedisServer(workdir / "redis-checkout")
    server.start()
    try:
        options = {"max_connections": 8, "timeout": 5, "socket_timeout": 2, "decode_responses": True}
        off = MaintNotificationsConfig(enabled=False)
        clients = {
            "redis-py's check, notifications on": redis.Redis(
                connection_pool=redis.BlockingConnectionPool.from_url(server.url, **options)
            ),
            "redis-py's check, notifications off": redis.Redis(
                connection_pool=redis.BlockingConnectionPool.from_url(
                    server.url, maint_notifications_config=off, **options
                )
            ),
            "poll(2) (make_redis)": make_redis(server.url, 8),
        }

        def arm(client: redis.Redis, what: str) -> Callable[[], float]:
            script = client.register_script("redis.call('SET', KEYS[1], ARGV[1]) return 1")

            def one() -> None:
                if what == "script":
                    script(keys=["fg:micro:a"], args=["1"])
                else:
                    pipe = client.pipeline(transaction=False)
                    pipe.get("fg:micro:a")
                    pipe.set("fg:micro:b", "1")
                    pipe.execute()

            def run(n: int = 10_000) -> float:
                n = max(1, n // SCALE)
                before = time.process_time()
                for _ in range(n):
                    one()
                return (time.process_time() - before) / n * 1e6

            return run

        arms = {f"{what}, {name}": arm(c, what) for what in ("script", "pipeline") for name, c in clients.items()}
        return alternated(arms)
    finally:
        server.kill()


def credit_round_trips() -> dict[str, float]:
    """A credit's statements (payment, wallet journal row, wallet upsert, outbox event, webhook
    call row with a 1 KB body), on a throw-away MariaDB database of the project's schema: in two
    round trips, the second after the upsert's balance came back; or in one, the event's INSERT
    reading the balance from the wallet's row (INSERT ... SELECT), or computing it from what the
    upsert left, with ledger.top_up's own statements. Client and MariaDB CPU µs per credit, one
    connection."""
    import hashlib
    from datetime import UTC, datetime

    import pymysql

    from webhooks.payments.ledger import _BALANCE_AFTER_UPSERT, _UPSERT_RETURNING_BALANCE
    from webhooks.storage import migrate
    from webhooks.storage.db import db, init_db

    mariadbd = subprocess.run(["pidof", "mariadbd", "mysqld"], capture_output=True, text=True).stdout.split()
    if not mariadbd:
        return {}
    pid = int(mariadbd[0])

    def db_cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    name = f"fg_micro_{os.getpid()}"
    admin = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    admin.cursor().execute(f"CREATE DATABASE {name}")
    try:
        init_db(f"mysql://root@127.0.0.1:3306/{name}", 2)
        with db.connection_context():
            migrate.upgrade(echo=lambda _line: None)
        conn = pymysql.connect(
            host="127.0.0.1",
            user="root",
            database=name,
            autocommit=True,
            client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS,
        )
        cur = conn.cursor()
        body = json.dumps({"event": "charge.success", "data": {"amount": 5000, "pad": "y" * 900}}).encode()
        pay = (
            "INSERT INTO payments (provider, reference, amount_minor, currency, customer, status, event_type, "
            "received_at, credited_at, payer, fees_minor, source) VALUES "
            "('paystack', %s, 5000, 'NGN', %s, 'credited', 'charge.success', NOW(6), NOW(6), %s, 0, 'webhook')"
        )
        journal = (
            "INSERT INTO wallet_entries (customer, currency, kind, amount_minor, reference, at) "
            "VALUES (%s, 'NGN', 'top_up', 5000, %s, NOW(6))"
        )
        upsert = (
            "INSERT INTO wallets (customer, currency, balance_minor, updated_at, version) "
            "VALUES (%s, 'NGN', 5000, NOW(6), 1) ON DUPLICATE KEY UPDATE "
            "balance_minor = balance_minor + VALUES(balance_minor), version = version + 1"
        )
        event = (
            "INSERT INTO events (event_id, type, subject, entity, body, created_at, fanned_out) "
            "VALUES (%s, 'wallet.credited', %s, %s, %s, NOW(6), 0)"
        )
        event_reading = (
            "INSERT INTO events (event_id, type, subject, entity, body, created_at, fanned_out) "
            "SELECT %s, 'wallet.credited', %s, %s, CONCAT(%s, balance_minor, '}}'), NOW(6), 0 "
            "FROM wallets WHERE customer = %s AND currency = 'NGN'"
        )
        event_computing = (
            "INSERT INTO events (event_id, type, subject, entity, body, created_at, fanned_out) "
            f"VALUES (%s, 'wallet.credited', %s, %s, CONCAT(%s, {_BALANCE_AFTER_UPSERT}, '}}}}'), NOW(6), 0)"
        )
        event_reading = (
            "INSERT INTO events (event_id, type, subject, entity, body, created_at, fanned_out) "
            "SELECT %s, 'wallet.credited', %s, %s, CONCAT(%s, balance_minor, '}}'), NOW(6), 0 "
            "FROM wallets WHERE customer = %s AND currency = 'NGN'"
        )
        call = (
            "INSERT INTO webhook_calls (provider, reference, event_type, headers, body, body_truncated, "
            "received_at, body_length, body_sha256, verdict, status_code) VALUES "
            "('paystack', %s, 'charge.success', '{}', %s, 0, NOW(6), %s, %s, 'credited', 200)"
        )

        def send(sql: str, params: list) -> None:
            cur.execute(sql, params)
            while cur.nextset():
                pass

        def credit(ref: str, customer: str, how: str) -> None:
            head = [ref, customer, customer, customer, f"paystack:{ref}", customer]
            tail = [ref, body, len(body), hashlib.sha256(body).hexdigest()]
            ev = [f"ev-{ref}", f"paystack:{ref}", customer, '{"balance_minor":']
            if how == "reading":
                send(
                    f"BEGIN; {pay}; {journal}; {upsert}; {event_reading}; {call}; COMMIT", head + ev + [customer] + tail
                )
            elif how == "computing":
                up = [customer, "NGN", 5000, datetime.now(UTC).replace(tzinfo=None)]
                statements = f"BEGIN; {pay}; {journal}; {_UPSERT_RETURNING_BALANCE}; {event_computing}; {call}; COMMIT"
                send(statements, head[:-1] + up + ev + [5000] + tail)
            else:
                send(f"BEGIN; {pay}; {journal}; {upsert}", head)
                send(f"{event}; {call}; COMMIT", [f"ev-{ref}", f"paystack:{ref}", customer, "{}", *tail])

        arms = {
            "two round trips": "two",
            "one round trip, the event reading the wallet": "reading",
            "one round trip, the event computing the balance (ledger.top_up)": "computing",
        }
        runs: dict[str, list[float]] = {}
        for r in range(ROUNDS):
            for label, how in arms.items():
                n = max(1, 1500 // SCALE)
                db_before, client_before = db_cpu(), time.process_time()
                for i in range(n):
                    credit(f"m{r}-{how}-{i}", f"payer{i % 500}@example.com", how)
                runs.setdefault(f"{label}: client", []).append((time.process_time() - client_before) / n * 1e6)
                runs.setdefault(f"{label}: MariaDB", []).append((db_cpu() - db_before) / n * 1e6)
        conn.close()
        return {label: round(statistics.median(v), 2) for label, v in runs.items()}
    finally:
        admin.cursor().execute(f"DROP DATABASE {name}")
        admin.close()


def reservation_billing(workdir: Path) -> dict[str, float]:
    """A lead's reservation (lua/reserve_lease.lua: ready, dedupe, three caps, circuits) for a
    buyer not billed, and for one billed whose price is also held against its balance in the
    same script: client CPU µs, Redis CPU µs and wall µs per reservation, one round trip each."""
    from datetime import datetime, timezone
    from decimal import Decimal
    from zoneinfo import ZoneInfo

    from webhooks.caps import leases
    from webhooks.leads.rules.buyers import BuyerRule
    from webhooks.storage.redis import make_store
    from webhooks.storage.scripts import NO_HOLD, Hold, LedgerBalance

    server = RedisServer(workdir / "redis-billing")
    server.start()
    try:
        store = make_store(server.url)
        now = datetime.now(timezone.utc)
        rule = BuyerRule(
            id="acme",
            endpoint_url="http://x",
            priority=1,
            price=Decimal("12.50"),
            price_minor=1250,
            tz=ZoneInfo("UTC"),
            limits=(("hourly", 10**9), ("daily", 10**9), ("daily_budget", 10**12)),
            states=frozenset(),
            blocked=frozenset(),
            schedule=None,
        )
        leases.mark_ready(store.redis, rule.id)
        store.sync_balance(rule.id, LedgerBalance("acme|USD", 10**15, 1, 0), init=True)

        def redis_cpu() -> float:
            info = store.redis.info("cpu")
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

        def run(hold: Hold, n: int = 5_000) -> tuple[float, float, float]:
            n = max(1, n // SCALE)
            server_before, client_before, wall = redis_cpu(), time.process_time(), time.perf_counter()
            for _ in range(n):
                leases.reserve(store, rule, now, lease_ttl_ms=60_000, probe_ttl_ms=10_000, hold=hold)
            wall = time.perf_counter() - wall
            return (
                (time.process_time() - client_before) / n * 1e6,
                (redis_cpu() - server_before) / n * 1e6,
                wall / n * 1e6,
            )

        runs: dict[str, list[float]] = {}
        for _ in range(ROUNDS):
            for name, hold in (("not billed", NO_HOLD), ("billed", Hold(1250, 0, "acme|USD"))):
                client, redis_side, wall = run(hold)
                runs.setdefault(f"{name}: client CPU", []).append(client)
                runs.setdefault(f"{name}: redis-server CPU", []).append(redis_side)
                runs.setdefault(f"{name}: wall", []).append(wall)
        return {name: round(statistics.median(v), 2) for name, v in runs.items()}
    finally:
        server.kill()


def render(d: dict) -> str:
    machine = ", ".join(f"{k} {v}" for k, v in d["machine"].items())
    lines = [
        "### Per-call costs of levers, outside the stack",
        "",
        f"Machine: {machine}. Medians of {ROUNDS} alternated runs, µs per call (process CPU time "
        "for the HTTP clients and the scripts, wall time of a tight loop otherwise).",
        "",
    ]
    for title, rows in d["results"].items():
        lines += [f"#### {title}", "", "| what | µs per call |", "|---|---|"]
        lines += [f"| {name} | {value:g} |" for name, value in rows.items()]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    global ROUNDS, SCALE
    if sys.argv[1:] == ["--quick"]:
        ROUNDS, SCALE = 1, 50
    with tempfile.TemporaryDirectory(prefix="fg-micro-") as tmp:
        results = {}
        for title, measure in (
            ("HTTP client of a buyer post (CPU under gevent)", http_clients),
            ("JSON", json_libraries),
            ("prometheus-client", prometheus),
            ("gevent.Timeout", timeout),
            ("A 3 KB Lua script in a pipeline", lambda: eval_or_evalsha(Path(tmp))),
            ("A lead's reservation, with and without a balance", lambda: reservation_billing(Path(tmp))),
            ("Redis: the pool's check of a connection it hands out (client CPU)", lambda: redis_checkout(Path(tmp))),
            ("A credit's transaction on MariaDB: two round trips or one", credit_round_trips),
        ):
            log(f"measuring: {title}")
            results[title] = measure()
            log(json.dumps(results[title]))
    data = {"results": results, "machine": machine_info()}
    write_json("micro.json", data)
    write_md("micro.md", render(data))
    log(f"wrote {OUT / 'micro.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
