"""The seed article's "concurrency matrix", measured: five ways to enforce a cap of 100 under
the seed's chaos test (1,000 webhooks from 50 threads paced over 5 s) and under a harder burst
(10,000 webhooks from 200 threads, as fast as possible), against a private redis-server and a
throw-away MariaDB database started for this run.

Each webhook is one cap decision; a granted decision counts as one delivery. Latency is timed
around the decision only (including any wait for a pooled connection, which the webhook would
also wait), never around the pacing. Writes bench/out/matrix.{json,md,png}.

    python -m bench.matrix
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from zoneinfo import ZoneInfo

import pymysql

ROOT = Path(__file__).resolve().parent.parent

from bench.common import (
    OUT,
    machine_info,
    markdown_table,
    mysql_version,
    paced_threads,
    percentiles,
    redis_version,
    write_json,
    write_md,
)
from testkit.servers import RedisServer, create_mysql_db, mysql_admin_url
from webhooks.caps import leases
from webhooks.caps.windows import CAPS
from webhooks.leads.buyers import BuyerRule
from webhooks.storage.redis import Store, make_redis

log = logging.getLogger("bench.matrix")

CAP = 100
BINDING_CAP = "daily"  # the Lua buyer's other caps are set too, far above this one
LARGE = 1_000_000
# MariaDB allows 151 connections in all and other processes share it: no strategy gets more
# than this many connections (redis-py's pool in make_redis has the same default size).
MAX_CONNECTIONS = 64
DEADLINE_S = 40.0  # no decision starts later than this into a scenario
POOL_WAIT_S = 5.0  # a thread waiting longer for a connection fails, as in make_redis's pool
QUERY_TIMEOUT_S = 10  # a MySQL call waiting longer fails (counted as an error)
LEASE_TTL_MS = 60_000


@dataclass(frozen=True)
class Scenario:
    name: str
    threads: int
    webhooks: int
    duration_s: float  # 0: all due at once

    @property
    def load(self) -> str:
        return f"paced over {self.duration_s:g} s" if self.duration_s else "as fast as possible"

    @property
    def connections(self) -> int:
        return min(self.threads, MAX_CONNECTIONS)


SCENARIOS = (Scenario("seed chaos", 50, 1_000, 5.0), Scenario("burst", 200, 10_000, 0.0))


@dataclass(frozen=True)
class Servers:
    mysql: dict  # PyMySQL connect() keywords of the throw-away database
    redis: str


class PoolExhausted(Exception):
    """No pooled MySQL connection came free in time."""


class MySQLPool:
    """A fixed set of open PyMySQL connections; threads wait for a free one (bounded)."""

    def __init__(self, kw: dict, size: int, autocommit: bool):
        self.free: queue.Queue = queue.Queue()
        for _ in range(size):
            self.free.put(
                pymysql.connect(
                    **kw, autocommit=autocommit, read_timeout=QUERY_TIMEOUT_S, write_timeout=QUERY_TIMEOUT_S
                )
            )

    def run(self, decide) -> bool:
        """decide(conn) on a pooled connection; after a failure, leave the connection clean."""
        try:
            conn = self.free.get(timeout=POOL_WAIT_S)
        except queue.Empty:
            raise PoolExhausted(f"no connection free within {POOL_WAIT_S:g} s") from None
        try:
            return decide(conn)
        except pymysql.MySQLError:
            try:
                conn.rollback()
            except pymysql.MySQLError:
                conn.ping(reconnect=True)
            raise
        finally:
            self.free.put(conn)

    def close(self) -> None:
        while not self.free.empty():
            self.free.get_nowait().close()


class MySQLStrategy:
    """Fresh `sales` and `caps` tables per scenario; subclasses make one decision."""

    autocommit = True
    sold_sql = "SELECT used FROM caps WHERE id = 1"  # what the store counts as sold afterwards

    def __init__(self, servers: Servers, scenario: Scenario, now: datetime):
        self.kw, self.day = servers.mysql, now.date()
        self.reset()
        self.pool = MySQLPool(self.kw, scenario.connections, self.autocommit)

    def reset(self) -> None:
        with pymysql.connect(**self.kw, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS sales, caps")
            cur.execute(
                "CREATE TABLE sales (id BIGINT AUTO_INCREMENT PRIMARY KEY, buyer_id INT NOT NULL,"
                " day DATE NOT NULL, KEY (buyer_id, day)) ENGINE=InnoDB"
            )
            cur.execute("CREATE TABLE caps (id INT PRIMARY KEY, cap INT NOT NULL, used INT NOT NULL) ENGINE=InnoDB")
            cur.execute("INSERT INTO caps VALUES (1, %s, 0)", (CAP,))

    def decide(self) -> bool:
        return self.pool.run(self.decide_on)

    def decide_on(self, conn) -> bool:
        raise NotImplementedError

    def stored(self) -> int:
        with pymysql.connect(**self.kw) as conn, conn.cursor() as cur:
            cur.execute(self.sold_sql)
            return cur.fetchone()[0]

    def close(self) -> None:
        self.pool.close()


class NaiveCount(MySQLStrategy):
    name, label = "naive_count", "naive COUNT(*) then INSERT (MySQL)"
    sold_sql = "SELECT COUNT(*) FROM sales"

    def decide_on(self, conn) -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM sales WHERE buyer_id = 1 AND day = %s", (self.day,))
            if cur.fetchone()[0] >= CAP:
                return False
            cur.execute("INSERT INTO sales (buyer_id, day) VALUES (1, %s)", (self.day,))
            return True


class ForUpdate(MySQLStrategy):
    name, label = "for_update", "SELECT ... FOR UPDATE, then increment (MySQL)"
    autocommit = False

    def decide_on(self, conn) -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT used, cap FROM caps WHERE id = 1 FOR UPDATE")
            used, cap = cur.fetchone()
            if used < cap:
                cur.execute("UPDATE caps SET used = used + 1 WHERE id = 1")
        conn.commit()  # also ends the refusing transactions, releasing the row lock
        return used < cap


class ConditionalUpdate(MySQLStrategy):
    name, label = "conditional_update", "UPDATE ... WHERE used < cap (MySQL)"

    def decide_on(self, conn) -> bool:
        with conn.cursor() as cur:
            return cur.execute("UPDATE caps SET used = used + 1 WHERE id = 1 AND used < cap") == 1


class RedisStrategy:
    """A Floodgate Redis client (make_redis) on a flushed database, its pool opened up front."""

    def __init__(self, servers: Servers, scenario: Scenario, now: datetime):
        self.r = make_redis(servers.redis, max_connections=scenario.connections)
        self.now = now
        self.r.flushdb()
        # Open every pooled connection now, so that no timed decision pays for a connect.
        held = [self.r.connection_pool.get_connection() for _ in range(scenario.connections)]
        for conn in held:
            self.r.connection_pool.release(conn)

    def close(self) -> None:
        self.r.connection_pool.disconnect()


class RedisIncr(RedisStrategy):
    name, label = "redis_incr", "Redis INCR, check, DECR when over"
    key = "bench:incr"

    def decide(self) -> bool:
        if self.r.incr(self.key) <= CAP:
            return True
        self.r.decr(self.key)
        return False

    def stored(self) -> int:
        return int(self.r.get(self.key) or 0)


class UnexpectedReservation(Exception):
    """reserve_lease answered neither ok nor full (not_ready, circuit_open)."""


class FloodgateLease(RedisStrategy):
    name, label = "floodgate_lease", "Floodgate Lua lease (lua/reserve_lease.lua, all caps)"

    def __init__(self, servers: Servers, scenario: Scenario, now: datetime):
        super().__init__(servers, scenario, now)
        limits = dict.fromkeys(CAPS, LARGE) | {BINDING_CAP: CAP}
        limits["daily_budget"] *= 100  # minor units: room for LARGE leads at 1.00 each
        self.buyer = BuyerRule(
            id="bench-buyer",
            endpoint_url="http://127.0.0.1:9/",
            priority=0,
            price=Decimal("1.00"),
            price_minor=100,
            tz=ZoneInfo("UTC"),
            limits=tuple(limits.items()),
            states=frozenset(),
            blocked=frozenset(),
            schedule=None,
        )
        leases.mark_ready(self.r, self.buyer.id)
        self.store = Store(self.r)
        self.r.script_load(self.store.scripts["reserve_lease"].script)  # no NOSCRIPT round on first use

    def decide(self) -> bool:
        result = leases.reserve(self.store, self.buyer, self.now, lease_ttl_ms=LEASE_TTL_MS, probe_ttl_ms=LEASE_TTL_MS)
        if result.status not in ("ok", "full"):
            raise UnexpectedReservation(result.status)
        return result.status == "ok"

    def stored(self) -> int:
        return leases.usage(self.r, self.buyer, self.now)[BINDING_CAP]["used"]


STRATEGIES = (NaiveCount, ForUpdate, ConditionalUpdate, RedisIncr, FloodgateLease)


@dataclass(frozen=True)
class Outcome:
    granted: bool
    ms: float
    error: str | None = None  # deadlock | lock_wait_timeout | error


def error_kind(exc: Exception) -> str:
    """MySQL's 1213 (deadlock) and 1205 (lock wait timeout) apart from every other failure."""
    code = exc.args[0] if isinstance(exc, pymysql.MySQLError) and exc.args else None
    return {1213: "deadlock", 1205: "lock_wait_timeout"}.get(code, "error")


def timed(strategy) -> tuple[Outcome, str | None]:
    """One decision, timed; a failure is a refusal with its kind and message."""
    start = time.perf_counter()
    try:
        granted = strategy.decide()
    except Exception as exc:
        ms = (time.perf_counter() - start) * 1000
        return Outcome(False, ms, error_kind(exc)), f"{type(exc).__name__}: {exc}"[:160]
    return Outcome(granted, (time.perf_counter() - start) * 1000), None


def measure(cls, servers: Servers, scenario: Scenario) -> dict[str, Any]:
    """Run `scenario` against a fresh instance of strategy `cls`; one row of the matrix."""
    now = datetime.now(timezone.utc)  # one instant per run: no cap window rolls over mid-run
    load_1m = round(os.getloadavg()[0], 2)
    strategy = cls(servers, scenario, now)
    try:
        run = paced_threads(
            scenario.threads, scenario.webhooks, scenario.duration_s, lambda _i: timed(strategy), deadline_s=DEADLINE_S
        )
        stored = strategy.stored()
    finally:
        strategy.close()
    done = [r for r in run.results if r is not None]
    outcomes = [o for o, _ in done]
    kinds = Counter(o.error for o in outcomes if o.error)
    granted = sum(o.granted for o in outcomes)
    decided = len(outcomes) - sum(kinds.values())
    lat = percentiles([o.ms for o in outcomes])
    mean_ms = round(statistics.fmean(o.ms for o in outcomes), 3) if outcomes else None
    return {
        "strategy": cls.name,
        "label": cls.label,
        "scenario": scenario.name,
        "threads": scenario.threads,
        "webhooks": scenario.webhooks,
        "load": scenario.load,
        "connections": scenario.connections,
        "granted": granted,
        "over_cap": granted - CAP,
        "stored": stored,
        "p50_ms": lat["p50"],
        "p95_ms": lat["p95"],
        "p99_ms": lat["p99"],
        "mean_ms": mean_ms,
        "decisions_per_s": round(decided / run.elapsed_s, 1) if run.elapsed_s else 0.0,
        "errors": kinds["error"],
        "deadlocks": kinds["deadlock"],
        "lock_wait_timeouts": kinds["lock_wait_timeout"],
        "not_started": scenario.webhooks - len(done),
        "stuck_threads": run.stuck_threads,
        "start_lag_p99_ms": percentiles(run.late_ms)["p99"],
        "elapsed_s": round(run.elapsed_s, 2),
        "load_1m": load_1m,
        "error_samples": dict(Counter(m for _, m in done if m).most_common(5)),
    }


COLUMNS = (  # (heading, row key) of the report's table
    ("strategy", "label"),
    ("threads", "threads"),
    ("webhooks", "webhooks"),
    ("offered", "load"),
    ("conns", "connections"),
    ("granted", "granted"),
    ("over cap", "over_cap"),
    ("store count", "stored"),
    ("p50 ms", "p50_ms"),
    ("p95 ms", "p95_ms"),
    ("p99 ms", "p99_ms"),
    ("decisions/s", "decisions_per_s"),
    ("errors", "errors"),
    ("deadlocks (1213)", "deadlocks"),
    ("lock waits timed out (1205)", "lock_wait_timeouts"),
    ("not started", "not_started"),
    ("start lag p99 ms", "start_lag_p99_ms"),
    ("load avg 1m", "load_1m"),
)


def reading(rows: list[dict]) -> list[str]:
    """Sentences quoting the run's own numbers, for whichever rows this run has."""
    by = {(r["strategy"], r["threads"]): r for r in rows}
    seed, burst = (s.threads for s in SCENARIOS)
    out = [over_delivery(rows)]
    if r := by.get(("for_update", burst)):
        out.append(
            f"The seed's failure mode B (FOR UPDATE at 200 workers, p95 past 4 s): here p95 "
            f"{r['p95_ms']} ms, p99 {r['p99_ms']} ms on {r['connections']} connections."
        )
    if (r := by.get(("floodgate_lease", seed))) and r["p99_ms"] is not None:
        verdict = "meets" if r["p99_ms"] < 2 else "misses"
        out.append(
            f"Floodgate's lease p99 at {seed} threads: {r['p99_ms']} ms ({verdict} the seed's "
            f"2 ms; p50 {r['p50_ms']} ms), {r['over_cap']} over the cap."
        )
    if (r := by.get(("floodgate_lease", burst))) and r["decisions_per_s"]:
        out.append(
            f"In the {burst}-thread burst each thread asks again as soon as it is answered, so "
            f"latency is mostly queueing in the client: {burst} in flight at {r['decisions_per_s']} "
            f"decisions/s means {burst / r['decisions_per_s'] * 1000:.1f} ms each on average "
            f"(Little's law); Floodgate's lease measured a mean of {r['mean_ms']} ms."
        )
    if ratios := sorted(
        (r["p99_ms"] / r["mean_ms"], r["strategy"]) for r in rows if r["threads"] == burst and r["mean_ms"]
    ):
        out.append(
            f"There the p99 is {ratios[0][0]:.0f}x ({ratios[0][1]}) to {ratios[-1][0]:.0f}x "
            f"({ratios[-1][1]}) the mean for the same work: waits for a pooled connection are "
            f"far from first come, first served."
        )
    if fastest := max((r for r in rows if r["threads"] == burst), default=None, key=lambda r: r["decisions_per_s"]):
        out.append(f"Most decisions/s at {burst} threads: {fastest['label']} ({fastest['decisions_per_s']}).")
    out.append(
        f"MySQL deadlocks (1213): {sum(r['deadlocks'] for r in rows)}; lock waits timed out (1205): "
        f"{sum(r['lock_wait_timeouts'] for r in rows)}."
    )
    out += [
        f"{r['label']} at {r['threads']} threads: {r['errors']} errors, mostly "
        f'"{max(r["error_samples"], key=r["error_samples"].get)}".'
        for r in rows
        if r["errors"]
    ]
    return out


def over_delivery(rows: list[dict]) -> str:
    """Which strategies sold past the cap, by how much (the seed's failure mode A: 18 over)."""
    leaky = [r for r in rows if r["over_cap"] > 0]
    if not leaky:
        return f"No strategy delivered past the cap of {CAP} (the seed's failure mode A claims 18 over)."
    return (
        "Over-delivery: "
        + "; ".join(
            f"{r['label']} delivered {r['over_cap']} over the cap of {CAP} at {r['threads']} threads" for r in leaky
        )
        + " (the seed's failure mode A: 18 over at 20 workers)."
    )


def markdown(data: dict) -> str:
    """The report: machine, method, the table, the reading; every figure from `data`."""
    m = data["machine"]
    return "\n\n".join(
        [
            "# Concurrency matrix: enforcing a cap of 100",
            f"{m['date']} · {m['nproc']} CPUs ({m['cpu_model']}) · MariaDB {m['mariadb']} · Redis {m['redis']} "
            f"· Python {m['python']} · run took {data['runtime_s']} s. "
            f"Clients, MariaDB and Redis share the machine.",
            f"Each webhook is one cap decision; latency is timed around the decision only. With more threads "
            f"than {MAX_CONNECTIONS} connections, threads wait for a pooled connection and that wait is part "
            f"of their latency; after {POOL_WAIT_S:g} s of waiting the decision fails (an error), as in "
            f"Floodgate's Redis pool. Decisions/s excludes errors; under pacing it is bounded by the offered load. "
            f"Start lag is how late a webhook began against its schedule: near 0 means the strategy kept up "
            f"with the paced load (in the as-fast-as-possible burst it is the queue). Load average "
            f"{m['loadavg_1m_5m_15m']} at the start (1, 5, 15 min); each row shows the 1-minute figure "
            f"as it began, since other work on the machine skews timings.",
            markdown_table(data["rows"], COLUMNS),
            "\n".join(f"- {s}" for s in reading(data["rows"])),
            "![matrix](matrix.png)",
        ]
    )


def plot(rows: list[dict], path: Path) -> None:
    """Over-cap deliveries, p99 latency and decisions/s, grouped by strategy, one bar per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [cls.name for cls in STRATEGIES]
    panels = (
        ("over_cap", "deliveries over the cap", False),
        ("p99_ms", "p99 decision latency (ms, log)", True),
        ("decisions_per_s", "decisions/s", False),
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    width = 0.8 / len(SCENARIOS)
    for ax, (key, title, log_scale) in zip(axes, panels):
        for j, sc in enumerate(SCENARIOS):
            values = [
                next((r[key] or 0 for r in rows if r["strategy"] == n and r["threads"] == sc.threads), 0) for n in names
            ]
            xs = [i + (j - (len(SCENARIOS) - 1) / 2) * width for i in range(len(names))]
            bars = ax.bar(xs, values, width, label=f"{sc.threads} threads, {sc.webhooks:,} webhooks, {sc.load}")
            ax.bar_label(bars, fmt="%.4g", fontsize=7)
        ax.set_title(title)
        ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=8)
        if log_scale:
            ax.set_yscale("log")
            ax.axhline(2, color="grey", linestyle="--", linewidth=1)
            ax.text(1.0, 2, " seed's\n 2 ms", transform=ax.get_yaxis_transform(), va="center", fontsize=7, color="grey")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Cap of {CAP}: five strategies, same servers, same run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def mysql_kwargs(url: str) -> dict:
    """PyMySQL connect() keywords for a mysql://user:pass@host:port/db URL."""
    p = urlparse(url)
    return dict(
        host=p.hostname,
        port=p.port or 3306,
        user=p.username or "root",
        password=p.password or "",
        database=p.path.lstrip("/"),
        connect_timeout=5,
    )


def run_all(servers: Servers, strategies: tuple) -> list[dict]:
    """Every scenario for every strategy, one after another, with a progress line each."""
    rows = []
    for scenario in SCENARIOS:
        for cls in strategies:
            log.info(
                "%s: %d webhooks from %d threads, %s ...", cls.name, scenario.webhooks, scenario.threads, scenario.load
            )
            row = measure(cls, servers, scenario)
            log.info(
                "  granted %d (over cap %d), p99 %s ms, %s decisions/s, errors %d, deadlocks %d",
                row["granted"],
                row["over_cap"],
                row["p99_ms"],
                row["decisions_per_s"],
                row["errors"],
                row["deadlocks"],
            )
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Start the servers, run the matrix, drop them, write the report; 2 without MySQL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--strategies", default=",".join(c.name for c in STRATEGIES), help="comma-separated subset of: %(default)s"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="[matrix] %(message)s")
    chosen = tuple(c for c in STRATEGIES if c.name in args.strategies.split(","))
    admin = mysql_admin_url()
    if admin is None:
        log.error("no MySQL/MariaDB answers at FG_TEST_MYSQL (default mysql://root@127.0.0.1:3306/)")
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fg-matrix-") as tmp, ExitStack() as cleanup:
        redis_server = RedisServer(Path(tmp))
        cleanup.callback(redis_server.kill)
        redis_server.start()
        db_url, drop = create_mysql_db(admin)
        cleanup.callback(drop)
        servers = Servers(mysql_kwargs(db_url), redis_server.url)
        with pymysql.connect(**servers.mysql) as conn, redis_server.client() as r:
            machine = machine_info(mariadb=mysql_version(conn), redis=redis_version(r))
        rows = run_all(servers, chosen)
    data = {
        "machine": machine,
        "cap": CAP,
        "max_connections": MAX_CONNECTIONS,
        "scenarios": [vars(s) | {"load": s.load} for s in SCENARIOS],
        "rows": rows,
        "runtime_s": round(time.monotonic() - started, 1),
    }
    write_json("matrix.json", data)
    write_md("matrix.md", markdown(data))
    plot(rows, OUT / "matrix.png")
    log.info("wrote %s/matrix.{json,md,png} in %.1f s", OUT, data["runtime_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
