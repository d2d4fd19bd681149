"""Payment webhooks per second on one MariaDB node against the 3-node Galera cluster behind
HAProxy (testkit/galera.py; issue 66), in one run, the arms alternated ABBA round after round
so that the shared machine's slow minutes fall on both. Each arm has a stack of its own
(redis-server, database, gunicorn with 2 gevent workers) and gets bench_payments' deliveries:
distinct payments, each delivered `repeats` times, shuffled; then the ledger is checked, and
200 one-row commits in a row time what a commit costs on the arm with nothing else running.
The one node is the same mariadbd from the very my.cnf a node gets, its wsrep lines dropped.

    python -m bench.galera [--rounds 6] [--payments 1500] [--repeats 5] [--concurrency 50]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import pymysql

from bench import common, stack
from bench.bench_payments import check_ledger, make_payments, run_phase, summarise
from testkit.config import SECRETS
from testkit.galera import GaleraCluster
from webhooks.storage.records.db import init_db

ARMS = ("one node", "cluster")
WSREP = ("wsrep_replicated", "wsrep_local_cert_failures", "wsrep_local_bf_aborts", "wsrep_flow_control_sent")


def one_node(es: ExitStack) -> tuple[str, list[int]]:
    """Node n1 alone without wsrep, from a node's own my.cnf: its admin URL and its pid."""
    holder = GaleraCluster(echo=stack.log)
    es.callback(holder.stop)
    url = holder.start_single()
    return url, [holder.nodes["n1"].proc.pid]


def cluster(es: ExitStack) -> tuple[str, list[int]]:
    galera = GaleraCluster(echo=stack.log)
    es.callback(galera.stop)
    galera.start()
    return galera.proxy_url, [p.pid for p in (galera.haproxy, *(n.proc for n in galera.nodes.values())) if p]


def probe(url: str, commits: int = 0) -> dict:
    """The writer's wsrep counters (none on the one node), then the median ms of `commits`
    autocommitted one-row updates in a row."""
    conn, took = pymysql.connect(**common.mysql_kwargs(url), autocommit=True), []
    with conn.cursor() as c:
        c.execute("SHOW GLOBAL STATUS LIKE 'wsrep_%'")
        status = dict(c.fetchall())
        if commits:  # after the counters are read: the round's writesets are the payments' alone
            c.execute("CREATE TABLE IF NOT EXISTS bench_probe (id INT PRIMARY KEY, n BIGINT NOT NULL)")
            c.execute("INSERT IGNORE INTO bench_probe VALUES (1, 0)")
        for _ in range(commits):
            t0 = time.perf_counter()
            c.execute("UPDATE bench_probe SET n = n + 1 WHERE id = 1")
            took.append((time.perf_counter() - t0) * 1000)
    conn.close()
    return {**{k: int(status.get(k) or 0) for k in WSREP}, "commit_ms": round(statistics.median(took or [0]), 3)}


def one_round(arm: dict, tag: str, args, rng: random.Random) -> dict:
    payments, expected = make_payments(args.payments, tag, rng)
    deliveries = [p for p in payments for _ in range(args.repeats)]
    rng.shuffle(deliveries)
    before, cpu = probe(arm["db"]), {k: stack.cpu_seconds(p) for k, p in arm["pids"].items()}
    started = time.perf_counter()
    results = run_phase(arm["url"], deliveries, args.concurrency)
    seconds = time.perf_counter() - started
    cpu = {k: (stack.cpu_seconds(p) - cpu[k]) * 1000 / args.payments for k, p in arm["pids"].items()}
    after, summary = probe(arm["db"], 200), summarise(results, seconds)
    init_db(arm["db"], pool_size=1)  # bench_payments' check reads through the module's proxy
    overall, first = common.percentiles([r["client_ms"] for r in results], (50, 99)), summary["first_deliveries"]
    return {
        "rps": summary["deliveries_per_s"],
        "payments_per_s": round(args.payments / seconds, 1),
        "p50_ms": overall["p50"],
        "p99_ms": overall["p99"],
        "first_p50_ms": first["client"]["p50_ms"],
        "first_p99_ms": first["client"]["p99_ms"],
        "commit_ms": after.pop("commit_ms"),
        **{f"{k}_cpu_ms_per_payment": round(v, 2) for k, v in cpu.items()},
        "errors": sum(n for s, n in summary["statuses"].items() if s.startswith("http_")),
        **{k: after[k] - before[k] for k in WSREP},
        **check_ledger(payments, expected, results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=common.quick(6, 1))
    parser.add_argument("--payments", type=int, default=common.quick(1500, 20))
    parser.add_argument("--repeats", type=int, default=common.quick(5, 2))
    parser.add_argument("--concurrency", type=int, default=common.quick(50, 10))
    args = parser.parse_args()
    rng, arms, rows = random.Random(66), {}, {name: [] for name in ARMS}
    with ExitStack() as es, tempfile.TemporaryDirectory(prefix="fg-bench-galera-") as tmp:
        for name, start in zip(ARMS, (one_node, cluster)):
            admin, db_pids = start(es)
            os.environ["FG_TEST_MYSQL"] = admin  # the server stack.base makes its database on
            base = stack.base(es, Path(tmp) / name[0], SECRETS, mysql_only=True)
            web = base.web(es, workers=2)
            arms[name] = {
                "url": web.url,
                "db": base.db_url,
                "pids": {"db": db_pids, "web": stack.tree(web.pid), "client": [os.getpid()]},
            }
            warm = argparse.Namespace(**{**vars(args), "payments": common.quick(100, 5)})
            one_round(arms[name], f"warm-{name[0]}", warm, rng)  # pools, buffer pool, gevent hubs
        for r in range(args.rounds):
            for name in ARMS if r % 2 == 0 else ARMS[::-1]:
                rows[name].append(one_round(arms[name], f"r{r}{name[0]}", args, rng))
                stack.log(f"round {r + 1} {name}: {rows[name][-1]}")
        version = common.mysql_version(pymysql.connect(**common.mysql_kwargs(base.db_url)))
    report = {"machine": common.machine_info(mariadb=version), "setup": vars(args), "arms": rows}
    common.write_json("galera.json", report)
    common.write_md("galera.md", render(report))
    print(render(report))
    return 0 if all(x["double_credits"] == x["lost_payments"] == 0 for v in rows.values() for x in v) else 1


COLUMNS = (
    ("arm", "arm"),
    ("deliveries/s", "rps"),
    ("payments/s", "payments_per_s"),
    ("p50 ms", "p50_ms"),
    ("p99 ms", "p99_ms"),
    ("first delivery p50 ms", "first_p50_ms"),
    ("p99 ms", "first_p99_ms"),
    ("one commit ms", "commit_ms"),
    ("database CPU ms/payment", "db_cpu_ms_per_payment"),
    ("web CPU ms/payment", "web_cpu_ms_per_payment"),
)


def render(report: dict) -> str:
    s, m, arms = report["setup"], report["machine"], report["arms"]
    med = {a: {k: round(statistics.median(x[k] for x in arms[a]), 3) for k in arms[a][0]} for a in ARMS}
    one, both = med["one node"], med["cluster"]
    rows = [{"arm": a, **{k: round(v, 2) for k, v in med[a].items()}} for a in ARMS]
    rows.append({"arm": "cluster / one node", **{k: round(both[k] / one[k], 2) if one[k] else "—" for k in one}})
    lines = [
        f"{m['date']} · {m['nproc']} CPUs · {m['mariadb']} · load average {m['loadavg_1m_5m_15m']}. "
        f"{s['rounds']} rounds per arm, alternated; each {s['payments']} distinct payments × {s['repeats']} "
        f"deliveries, shuffled, at concurrency {s['concurrency']}; medians of the rounds. Latency is the "
        "client's, over every delivery, then over first deliveries (the credits). Database CPU: "
        "mariadbd, on the cluster its three nodes and HAProxy.",
        "",
        common.markdown_table(rows, COLUMNS),
        "",
    ]
    for a in ARMS:
        t = {k: sum(x[k] for x in arms[a]) for k in arms[a][0]}
        lines.append(
            f"- {a}, every round: double credits **{t['double_credits']}**, lost payments **{t['lost_payments']}**, "
            f"wallets off {t['wallets_off']}, 4xx/5xx {t['errors']}; deliveries/s {[x['rps'] for x in arms[a]]}"
            + (f"; {', '.join(f'{k} {t[k]}' for k in WSREP)}." if a == "cluster" else ".")
        )
    cpu = {a: sum(med[a][f"{k}_cpu_ms_per_payment"] for k in ("db", "web", "client")) for a in ARMS}
    lines.append(  # what bounds each arm's rate: bench/REPORT.md part 42 reads these
        f"\nWritesets a payment: {both['wsrep_replicated'] / s['payments']:.2f}. CPU ms a payment (database, "
        f"web, client): one node {cpu['one node']:.2f}, cluster {cpu['cluster']:.2f}."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
