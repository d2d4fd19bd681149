"""Redis Cluster: what a primary's failover does to the caps, what the replica wait
(CAP_WAIT_REPLICAS=1) buys and costs, and one Redis against the 3-primary cluster, all in one run.

1. Failover: the seed's chaos burst (1,000 leads from 50 threads) against six buyers with a
   daily cap of 100, two on each primary, each lead for one buyer (by state); a primary is
   killed (-9) as lead 300 is sent, either with its replica in sync or after the replica was
   cut off from it for CUT_MS (frozen with SIGSTOP and its link closed: a partition, the way
   Redis Cluster loses acknowledged writes). Once the replica is promoted and the killed node
   is back as its replica, the
   victim's buyers are sold to until they refuse; the buyer server counts each buyer's
   deliveries, and a forgotten increment shows as a delivery over the cap. Repeated, with the
   setting off and on.
2. Lease: leases.reserve from 50 threads, paced (1,000 over 5 s, the seed's load) and as fast as
   possible (5,000), on one redis-server, on the cluster, on the cluster with the replica wait.
3. End to end: wrk against the lead path (gunicorn, 2 gevent workers; buyer stub at 20 ms) on
   the same three.

    python -m bench.cluster_failover [--reps 5] [--seconds 10] [--cut-ms 100]
Writes bench/out/cluster.json, cluster.md and cluster.png; bench/e2e.py's wrk helper and
lead.lua drive the end-to-end rows.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import redis
import requests

ROOT = Path(__file__).resolve().parent.parent

from bench import stack
from bench.common import (
    OUT,
    QUICK,
    machine_info,
    markdown_table,
    paced_threads,
    percentiles,
    quick,
    redis_version,
    write_json,
    write_md,
)
from bench.e2e import ADMIN, API_KEY, BIG, cpu_seconds, tree, warm, wrk
from testkit.cluster import LocalCluster, wait_for_failover
from testkit.servers import (
    BuyerServer,
    Proc,
    WebServer,
    free_port,
    venv_bin,
    wait_until,
)
from webhooks.caps import leases
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage import keys
from webhooks.storage.redis import make_store

CAP, LEADS, THREADS, KILL_AT = quick(100, 20), quick(1000, 200), 50, quick(300, 60)
PER_PRIMARY = 2
WAIT_ENV = {"CAP_WAIT_REPLICAS": "1", "CAP_WAIT_TIMEOUT_MS": "100"}
ROUNDS = quick(3, 1)  # lease and end-to-end measurements per backend, interleaved
# leases.reserve's loads: (name, decisions, seconds to pace them over; 0: as fast as possible)
LEASE_LOADS = (
    (("paced 100 over 0.5 s", 100, 0.5), ("as fast as possible, 500", 500, 0.0))
    if QUICK
    else (("paced 1,000 over 5 s", 1000, 5.0), ("as fast as possible, 5,000", 5000, 0.0))
)
LEASE_TTL_MS = 60_000


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Admin:
    """The admin API of one web server."""

    def __init__(self, base: str):
        self.base, self.http = base, requests.Session()
        self.http.headers["Authorization"] = f"Bearer {ADMIN}"

    def put(self, path: str, body: dict) -> None:
        self.http.put(self.base + path, json=body, timeout=10).raise_for_status()

    def delete_buyer(self, bid: str) -> None:
        self.http.delete(f"{self.base}/v1/admin/buyers/{bid}", timeout=10)


def spread_buyers(cluster: LocalCluster, prefix: str) -> dict[int, list[str]]:
    """PER_PRIMARY buyer ids whose hash tag lands on each primary, by primary port."""
    client = cluster.client()
    found: dict[int, list[str]] = {p: [] for p in cluster.primaries()}
    for i in range(10_000):
        bid = f"{prefix}{i}"
        group = found[client.get_node_from_key(keys.ready(bid)).port]
        if len(group) < PER_PRIMARY:
            group.append(bid)
        if all(len(g) == PER_PRIMARY for g in found.values()):
            break
    client.close()
    return found


def failover_rep(cluster: LocalCluster, web: WebServer, buyers: BuyerServer, tag: str, rep: int, cut_ms: int) -> dict:
    """One chaos burst with a primary killed in it (its replica cut off from it `cut_ms`
    before, when not 0); deliveries per buyer against the cap."""
    admin = Admin(web.url)
    tag = f"{tag}{cut_ms}x{rep}"
    by_primary = spread_buyers(cluster, f"{tag}b")
    victim = sorted(by_primary)[rep % len(by_primary)]
    ids = [b for group in by_primary.values() for b in group]
    for i, bid in enumerate(ids):
        buyers.add(bid)
        admin.put(
            f"/v1/admin/buyers/{bid}",
            {
                "name": bid,
                "endpoint_url": buyers.url(bid),
                "price": "10.00",
                "caps": {"daily": CAP},
                "states": [f"S{i}"],
            },
        )
    time.sleep(1.2)  # every web process has the buyers
    promoted: dict = {}
    local = threading.local()

    def post(i: int, lead_id: str) -> str:
        s = getattr(local, "s", None) or requests.Session()
        local.s = s
        try:
            resp = s.post(
                f"{web.url}/v1/leads",
                json={"lead_id": lead_id, "state": f"S{i % len(ids)}"},
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=30,
            )
            body = resp.json()
            return body.get("status") or body["error"]["code"]
        except (requests.RequestException, ValueError, KeyError):
            return "error"

    def one(i: int) -> str:
        if i == KILL_AT:
            replica = cluster.procs[cluster.replica_of(victim)]
            if cut_ms:  # frozen, the replica cannot reconnect: nothing the primary does reaches it
                replica.send_signal(signal.SIGSTOP)
                redis.Redis(port=victim).client_kill_filter(_type="replica")
                time.sleep(cut_ms / 1000)
            cluster.kill_node(victim)
            if cut_ms:
                replica.send_signal(signal.SIGCONT)
            killer = threading.Thread(target=lambda: promoted.update(s=wait_for_failover(cluster, victim)))
            killer.start()
            promoted["thread"] = killer
        return post(i, f"{tag}-{i}")

    started = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        statuses = Counter(pool.map(one, range(LEADS)))
    burst_s = time.monotonic() - started
    promoted["thread"].join(60)
    # The killed node comes back as the new primary's replica, as a process manager would
    # bring it back (until then, with the replica wait on, that primary refuses every lead).
    cluster.start_node(victim)
    cluster.wait_ok()
    # Sell to the victim's buyers until each refuses: a forgotten increment shows as a sale past the cap.
    fill = Counter()
    for bid in by_primary[victim]:
        i = ids.index(bid)
        for n in range(3 * CAP):
            fill[answer := post(i, f"{tag}-fill-{bid}-{n}")] += 1
            if answer == "unsold":
                break
    delivered = {bid: buyers.buyers[bid].accepted for bid in ids}
    for bid in ids:
        admin.delete_buyer(bid)
    over = {bid: max(0, n - CAP) for bid, n in delivered.items()}
    row = {
        "rep": rep,
        "cut_ms": cut_ms,
        "killed": victim,
        "burst_s": round(burst_s, 2),
        "promotion_s": round(promoted.get("s", -1), 2),
        "statuses": dict(statuses),
        "fill": dict(fill),
        "delivered": delivered,
        "over_cap": over,
        "over_total": sum(over.values()),
        "buyers_over": sum(1 for v in over.values() if v),
    }
    log(
        f"{tag}: over cap {row['over_total']} ({row['buyers_over']} buyers), promotion "
        f"{row['promotion_s']} s, {dict(statuses)}"
    )
    return row


def lease_rows(label: str, url: str, wait: int) -> list[dict]:
    """leases.reserve latency from 50 threads, paced and as fast as possible."""
    r = make_store(url, wait_replicas=wait, wait_timeout_ms=int(WAIT_ENV["CAP_WAIT_TIMEOUT_MS"]))
    limits = (("hourly", BIG), ("daily", BIG), ("daily_budget", BIG * 100))
    buyers = [
        BuyerRule(
            id=f"lease{i}",
            endpoint_url="http://127.0.0.1:9/",
            priority=0,
            price=Decimal("1.00"),
            price_minor=100,
            tz=ZoneInfo("UTC"),
            limits=limits,
            states=frozenset(),
            blocked=frozenset(),
            schedule=None,
        )
        for i in range(6)
    ]
    for b in buyers:
        leases.mark_ready(r.redis, b.id)
    now = datetime.now(timezone.utc)
    rows = []
    for load, n, duration in LEASE_LOADS:
        ms: list[float] = []

        def decide(i: int, ms: list[float] = ms) -> str:
            t = time.perf_counter()
            status = leases.reserve(
                r, buyers[i % len(buyers)], now, lease_ttl_ms=LEASE_TTL_MS, probe_ttl_ms=LEASE_TTL_MS
            ).status
            ms.append((time.perf_counter() - t) * 1000)
            return status

        run = paced_threads(THREADS, n, duration, decide)
        errors = sum(isinstance(x, Exception) for x in run.results)
        rows.append(
            {
                "backend": label,
                "load": load,
                **percentiles(ms),
                "errors": errors,
                "decisions_per_s": round(len(ms) / run.elapsed_s, 1),
            }
        )
        log(f"lease {label} {load}: {rows[-1]}")
    r.redis.close()
    return rows


def e2e_row(label: str, web: WebServer, seconds: int, round_: int) -> dict:
    """Lead-path throughput at 50 connections (buyer stub at 20 ms, caps far away), and the
    web processes' CPU per lead: on this machine the cluster's six servers share its two
    cores with the web processes, which a real deployment does not."""
    slug = "".join(c for c in label if c.isalnum()) + str(round_)  # lead ids never repeat
    pids = tree(web.pid)
    warm(web.url, 50, f"warm{slug}")
    before = cpu_seconds(pids)
    result = wrk(web.url, 50, seconds, f"e2e{slug}")
    result["web_cpu_ms_per_lead"] = round((cpu_seconds(pids) - before) / max(1, result["requests"]) * 1000, 3)
    log(f"e2e {label}: {result}")
    return {"backend": label, **result}


def configure_e2e(web: WebServer, buyer_id: str, buyer_url: str) -> None:
    """The publisher, and a buyer new to this Redis (a known buyer's counters would first be
    rebuilt from the ledger: 503s meanwhile). The publisher is shared by the backends (one
    ledger): a Redis that did not see it made holds no memory of its answers, which is a
    Redis that lost them (lua/claim_lead.lua), so its leads wait one claim's life before they
    are routed; a probe lead is sent until one is answered, so the measured runs do not."""
    admin = Admin(web.url)
    admin.put("/v1/admin/publishers/bench", {"name": "Bench", "api_key": API_KEY, "commission_pct": "10"})
    admin.put(
        f"/v1/admin/buyers/{buyer_id}",
        {
            "name": "Acme",
            "endpoint_url": buyer_url,
            "price": "12.50",
            "caps": {"hourly": BIG, "daily": BIG, "daily_budget": "999999999.00"},
        },
    )
    time.sleep(1.2)
    probes = iter(range(10**6))

    def routed() -> bool:
        resp = requests.post(
            f"{web.url}/v1/leads",
            json={"lead_id": f"probe-{buyer_id}-{next(probes)}"},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=30,
        )
        return resp.status_code == 200

    wait_until(routed, timeout=60, interval=0.5, what=f"leads routed on the backend of {buyer_id}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="failover repetitions per setting")
    ap.add_argument("--seconds", type=int, default=10, help="length of each end-to-end run")
    ap.add_argument("--cut-ms", type=int, default=100, help="replica cut off this long before a kill")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwind: stop every server started here
    started = time.monotonic()
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="fg-cluster-")))
        single, queue = stack.redis(es, tmp, "single"), stack.redis(es, tmp, "queue")
        cluster = LocalCluster(tmp / "cluster", node_timeout_ms=1000)
        cluster.start()
        es.callback(cluster.kill)
        db_url = stack.database(es, tmp)
        base = {
            **os.environ,
            "DATABASE_URL": db_url,
            "ADMIN_TOKEN": ADMIN,
            "PYTHONUNBUFFERED": "1",
            "PUBLISHER_RATE_LIMIT": "off",
        }
        subprocess.run(
            [venv_bin("flask"), "--app", "wsgi", "db", "upgrade"],
            env={**base, "REDIS_URL": single.url},
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        stub_port = free_port()
        stub = Proc([venv_bin("python"), "-m", "testkit.buyer_stub", str(stub_port)], base, tmp / "stub.log")
        es.callback(stub.stop)
        buyers = BuyerServer()
        es.callback(buyers.close)
        # One Redis as deployed today (the queue on it too); the cluster with its queue beside it.
        on_cluster = {"REDIS_URL": cluster.url, "RQ_REDIS_URL": queue.url}
        backends = (
            ("one Redis", {"REDIS_URL": single.url}),
            ("cluster", on_cluster),
            ("cluster + CAP_WAIT_REPLICAS=1", {**on_cluster, **WAIT_ENV}),
        )
        webs = []
        for n, (_label, extra) in enumerate(backends):
            env = {**base, **extra}
            webs.append(WebServer(env, tmp / f"web{n}.log", workers=2))
            es.callback(webs[-1].stop)
            worker = Proc(
                [
                    venv_bin("rq"),
                    "worker",
                    "--url",
                    env.get("RQ_REDIS_URL", env["REDIS_URL"]),
                    "-w",
                    "rq.worker.SimpleWorker",
                    "-q",
                    "floodgate",
                    "floodgate-events",
                ],
                env,
                tmp / f"worker{n}.log",
            )
            es.callback(worker.stop)
            configure_e2e(webs[-1], f"acme{n}", f"http://127.0.0.1:{stub_port}/acme")
        # Rounds interleave the backends, so that other work on the machine weighs on each alike.
        leases, e2e = [], []
        for round_ in range(ROUNDS):
            for (label, extra), web in zip(backends, webs):
                leases += lease_rows(label, extra["REDIS_URL"], int(extra.get("CAP_WAIT_REPLICAS", 0)))
                e2e.append(e2e_row(label, web, args.seconds, round_))
        for n in range(len(webs)):  # the failover buyers must be the only ones (one ledger for all)
            Admin(webs[0].url).delete_buyer(f"acme{n}")
        failover = {}
        for (_, extra), web in zip(backends, webs):
            if "RQ_REDIS_URL" in extra:
                tag = "on" if "CAP_WAIT_REPLICAS" in extra else "off"
                failover[tag] = [
                    failover_rep(cluster, web, buyers, tag, rep, cut)
                    for cut in (0, args.cut_ms)
                    for rep in range(args.reps)
                ]
        versions = {"redis": redis_version(single.client())}
    data = {
        "machine": machine_info(**versions),
        "took_s": round(time.monotonic() - started, 1),
        "setup": {
            "cap": CAP,
            "leads": LEADS,
            "threads": THREADS,
            "kill_at_lead": KILL_AT,
            "cut_ms": args.cut_ms,
            "buyers": 3 * PER_PRIMARY,
            "cluster_node_timeout_ms": 1000,
            "wait": WAIT_ENV,
        },
        "failover": failover,
        "lease": medians(leases, ("backend", "load")),
        "lease_rounds": leases,
        "e2e": medians(e2e, ("backend",)),
        "e2e_rounds": e2e,
    }
    write_json("cluster.json", data)
    write_md("cluster.md", render(data))
    plot(data, OUT / "cluster.png")
    log(f"wrote {OUT / 'cluster.md'}")
    return 0


def medians(rows: list[dict], by: tuple[str, ...]) -> list[dict]:
    """One row per `by` value, each number the median of the rounds (in first-seen order)."""
    out: dict[tuple, list[dict]] = {}
    for row in rows:
        out.setdefault(tuple(row[k] for k in by), []).append(row)
    return [
        {
            **same[0],
            **{
                k: statistics.median(r[k] for r in same)
                for k, v in same[0].items()
                if isinstance(v, (int, float)) and all(r[k] is not None for r in same)
            },
            "rounds": len(same),
        }
        for same in out.values()
    ]


def groups(d: dict) -> list[tuple[str, str, list[dict]]]:
    """(setting, failure, reps) for each setting and failure mode of the failover runs."""
    out = []
    for tag, reps in d["failover"].items():
        for cut in sorted({r["cut_ms"] for r in reps}):
            failure = f"replica cut off {cut} ms before kill -9" if cut else "kill -9, replica in sync"
            out.append(
                (f"CAP_WAIT_REPLICAS={'1' if tag == 'on' else '0'}", failure, [r for r in reps if r["cut_ms"] == cut])
            )
    return out


def summary(setting: str, failure: str, reps: list[dict]) -> dict:
    over = [r["over_total"] for r in reps]
    return {
        "setting": setting,
        "failure": failure,
        "reps": len(reps),
        "reps_over": sum(1 for o in over if o),
        "over_total": sum(over),
        "over_max": max(over, default=0),
        "promotion_s": max((r["promotion_s"] for r in reps), default=None),
        "unavailable": sum(r["statuses"].get("unavailable", 0) + r["statuses"].get("error", 0) for r in reps),
    }


def render(d: dict) -> str:
    fo = [summary(*g) for g in groups(d)]
    per_rep = [
        {
            "setting": setting,
            "failure": failure,
            "sold": r["statuses"].get("sold", 0),
            "503": r["statuses"].get("unavailable", 0),
            **{k: r[k] for k in ("rep", "over_total", "buyers_over", "promotion_s", "burst_s")},
        }
        for setting, failure, reps in groups(d)
        for r in reps
    ]
    by = {(r["backend"], r["load"]): r for r in d["lease"]}
    e2e = {r["backend"]: r for r in d["e2e"]}
    m, s = d["machine"], d["setup"]
    reading = [
        f"- {f['setting']}, {f['failure']}: {f['reps_over']} of {f['reps']} failovers let a cap be exceeded, "
        f"by {f['over_total']} deliveries in all (at most {f['over_max']} in one)."
        for f in fo
    ]
    paced = LEASE_LOADS[0][0]
    one, cl, cw = (by.get((b, paced)) for b in ("one Redis", "cluster", "cluster + CAP_WAIT_REPLICAS=1"))
    if one and cl and cw:
        reading.append(
            f"- Lease p50/p99 at the seed's load: one Redis {one['p50']}/{one['p99']} ms, cluster "
            f"{cl['p50']}/{cl['p99']} ms, cluster with the wait {cw['p50']}/{cw['p99']} ms."
        )
    if len(e2e) == 3:
        a, b, c = (e2e[k]["rps"] for k in ("one Redis", "cluster", "cluster + CAP_WAIT_REPLICAS=1"))
        reading.append(
            f"- End to end at 50 connections: {a} leads/s on one Redis, {b} on the cluster "
            f"({b / a:.0%}), {c} with the wait ({c / a:.0%})."
        )
    return "\n".join(
        [
            "# Redis Cluster: failover, replica wait, one Redis against the cluster",
            "",
            f"{m['date']} · {m['nproc']} CPUs ({m['cpu_model']}) · Redis {m['redis']} · Python {m['python']} · "
            f"run took {d['took_s']} s; load average {m['loadavg_1m_5m_15m']} at the end. Every process "
            f"(8 redis-servers, 3 gunicorns, wrk, MariaDB) shares the machine; "
            f"the cluster is 3 primaries + 3 replicas on loopback, cluster-node-timeout {s['cluster_node_timeout_ms']} ms.",
            "",
            f"## Failover during the chaos burst ({s['leads']} leads, {s['threads']} threads, {s['buyers']} buyers "
            f"with a daily cap of {s['cap']}, a primary killed at lead {s['kill_at_lead']})",
            "",
            markdown_table(
                fo,
                (
                    ("setting", "setting"),
                    ("failure", "failure"),
                    ("failovers", "reps"),
                    ("failovers over a cap", "reps_over"),
                    ("deliveries over cap, all", "over_total"),
                    ("most in one failover", "over_max"),
                    ("slowest promotion s", "promotion_s"),
                    ("503 / errors", "unavailable"),
                ),
            ),
            "",
            markdown_table(
                per_rep,
                (
                    ("setting", "setting"),
                    ("failure", "failure"),
                    ("rep", "rep"),
                    ("over cap", "over_total"),
                    ("buyers over", "buyers_over"),
                    ("promotion s", "promotion_s"),
                    ("burst s", "burst_s"),
                    ("sold", "sold"),
                    ("503", "503"),
                ),
            ),
            "",
            f"## Lease (leases.reserve from 50 threads; ms; median of {ROUNDS} interleaved rounds)",
            "",
            markdown_table(
                d["lease"],
                (
                    ("backend", "backend"),
                    ("load", "load"),
                    ("p50", "p50"),
                    ("p95", "p95"),
                    ("p99", "p99"),
                    ("decisions/s", "decisions_per_s"),
                    ("errors", "errors"),
                ),
            ),
            "",
            f"## End to end (wrk, 50 connections, buyer stub at 20 ms; median of {ROUNDS} interleaved rounds)",
            "",
            markdown_table(
                d["e2e"],
                (
                    ("backend", "backend"),
                    ("leads/s", "rps"),
                    ("p50 ms", "p50_ms"),
                    ("p99 ms", "p99_ms"),
                    ("errors", "errors"),
                    ("web CPU ms per lead", "web_cpu_ms_per_lead"),
                ),
            ),
            "",
            "## Reading",
            "",
            *reading,
            "",
            "![cluster](cluster.png)",
        ]
    )


def plot(d: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(17, 5))
    found = groups(d)
    width = 0.8 / max(1, len(found))
    for k, (setting, failure, reps) in enumerate(found):
        a.bar(
            [r["rep"] + (k - (len(found) - 1) / 2) * width for r in reps],
            [r["over_total"] for r in reps],
            width=width,
            label=f"{setting}, {failure}",
        )
    a.set(xlabel="failover (repetition)", ylabel="deliveries over the cap", title="Over-cap deliveries per failover")
    a.legend(fontsize=7)
    paced = [r for r in d["lease"] if r["load"].startswith("paced")]
    xs = range(len(paced))
    b.bar([x - 0.2 for x in xs], [r["p50"] for r in paced], width=0.4, label="p50")
    b.bar([x + 0.2 for x in xs], [r["p99"] for r in paced], width=0.4, label="p99")
    b.set_xticks(list(xs), [r["backend"].replace(" + ", "\n+ ") for r in paced])
    b.set(ylabel="ms", title="Lease at the seed's load (50 threads)")
    b.legend()
    c.bar(range(len(d["e2e"])), [r["rps"] for r in d["e2e"]])
    c.set_xticks(list(range(len(d["e2e"]))), [r["backend"].replace(" + ", "\n+ ") for r in d["e2e"]])
    c.set(ylabel="leads/s", title="Lead path, 50 connections")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
