"""Floodgate against the plain seed, side by side: the bare Flask endpoint (the ceiling),
Floodgate (bench/stack.py's Stack, its code a worktree of HEAD) and the plain seed
(bench/plain_seed/: the two articles as written, with its own redis-server, database in the
same MariaDB server, RQ worker and the same buyer stub), all under the same gunicorn settings,
started once and measured in turn, the order rotated round after round.

Each round and arm, wrk at 2 threads / 50 connections: leads (bench/lead.lua, the buyer answering
in 20 ms); payments, the `first` mix (6,000 Paystack payments × 5 deliveries, shuffled: most
requests in 10 s are a payment's first delivery) and the `dup` mix (2,000 × 5, shuffled: most
are duplicates). Requests/s, p50/p99 and CPU ms per request by process (web, redis-server, RQ
worker, mariadbd), charged from the start of the run until the arm's queue is drained, so work
deferred to a worker counts. The bare endpoint answers leads only.

Two probes against Floodgate and the plain seed:
(a) 30 lead ids, each sent 3 times at once (90 concurrent requests), to a buyer with room for
    all: how many posts the buyer received (one per lead is right).
(b) a payment whose first delivery fails after its duplicates were answered: the payments table
    is locked (LOCK TABLES ... WRITE) so the first delivery waits inside its transaction, 4
    duplicates are sent and answered, then the arm's database connections are killed (the
    database briefly gone) and the lock released. A provider stops retrying once any delivery
    got a 2xx; if none did, it retries (here up to 30 times, 1 s apart). Then: is the payment in the
    ledger?

    python -m bench.versus [--rounds 5] [--seconds 10]
Writes bench/out/versus.json, versus.md and bench/figures/versus.png (bench/out/ in a quick run).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import requests
from rq import Queue

ROOT = Path(__file__).resolve().parent.parent

from bench import stack as stack_mod
from bench.common import OUT, QUICK, head_rev, machine_info, quick, worktrees, write_json, write_md
from bench.probes import probe_leads, probe_payment
from bench.stack import (
    API_KEY,
    Stack,
    cpu_seconds,
    drained,
    first_deliveries,
    log,
    lua_list,
    mariadbd,
    tree,
    warm,
    wrk,
    wrk_payments,
)
from testkit.config import SECRETS
from testkit.servers import BuyerServer, Proc, free_port, listening, venv_bin, wait_until

FIRST = quick(6000, 100)  # payments of the `first` mix
DUP = quick(2000, 100)  # payments of the `dup` mix
PROCESSES = ("web", "redis", "worker", "db")


@dataclass
class Arm:
    name: str
    url: str
    pids: Callable[[], dict[str, list[int]]]
    drain: Callable[[], object] = lambda: None
    payments: bool = True
    rows: list[dict] = field(default_factory=list)


def start_plain(es: ExitStack, tmp: Path, env: dict, redis_url: str, db_url: str, buyer_url: str, tag: str) -> Proc:
    """The plain seed's gunicorn (the same gunicorn.conf.py, 2 workers) on a free port."""
    port = free_port()
    prom = tmp / f"prometheus-{tag}"
    prom.mkdir(exist_ok=True)
    proc = Proc(
        [venv_bin("gunicorn"), "-c", "gunicorn.conf.py", "bench.plain_seed.app:app"],
        {
            **env,
            "PORT": str(port),
            "WEB_CONCURRENCY": "2",
            "PROMETHEUS_MULTIPROC_DIR": str(prom),
            "PLAIN_REDIS_URL": redis_url,
            "PLAIN_DATABASE_URL": db_url,
            "PLAIN_BUYER_URL": buyer_url,
        },
        tmp / f"{tag}.log",
    )
    es.callback(proc.stop)
    proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    wait_until(lambda: listening(port), timeout=60, what=f"{tag} gunicorn")
    lead = {"lead_id": f"{tag}-hello", "state": "TX"}
    answer = requests.post(
        proc.url + "/v1/leads", json=lead, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
    )  # type: ignore[attr-defined]
    if answer.json().get("status") != "sold":
        raise SystemExit(f"the plain seed does not sell: {answer.text}")
    return proc


def cpu_run(arm: Arm, run: Callable[[], dict]) -> tuple[dict, dict[str, float]]:
    """`run()` (a wrk run), then the arm's drain; CPU ms per request of each process group over both."""
    groups = arm.pids()
    before = {k: cpu_seconds(p) for k, p in groups.items()}
    result = run()
    arm.drain()
    n = max(1, result["requests"])
    cpu = {k: round((cpu_seconds(p) - before[k]) / n * 1000, 3) for k, p in groups.items()}
    cpu["all"] = round(sum(cpu[k] for k in groups), 3)
    return result, cpu


def measure(arm: Arm, seconds: int, rng: random.Random, tmp: Path) -> dict:
    warm(arm.url, 50, "warm")
    arm.drain()
    tag = f"vs{rng.randrange(10**9)}"
    leads, cpu = cpu_run(arm, lambda: wrk(arm.url, 50, seconds, tag))
    row: dict = {"lead_rps": leads["rps"], "lead_p50_ms": leads["p50_ms"], "lead_p99_ms": leads["p99_ms"]}
    row["lead_errors"] = leads["errors"]
    row.update({f"lead_cpu_{k}": v for k, v in cpu.items()})
    if not arm.payments:
        return row
    for mix in ("first", "dup"):
        if mix == "first":
            deliveries = first_deliveries(f"{tag}f", FIRST, rng)
        else:
            # the duplicate-heavy mix: the same list (1 + 4 repeats, shuffled) short enough
            # that wrk runs past its end and starts it again (all duplicates then)
            deliveries = first_deliveries(f"{tag}d", DUP, rng, payers=200)
        listing = tmp / "deliveries.lua"
        lua_list(deliveries, listing)
        pay, cpu = cpu_run(arm, lambda listing=listing: wrk_payments(arm.url, listing, 50, seconds))
        row.update({f"{mix}_rps": pay["rps"], f"{mix}_p50_ms": pay["p50_ms"], f"{mix}_p99_ms": pay["p99_ms"]})
        row[f"{mix}_non_2xx"] = pay["non_2xx_or_errors"]
        row.update({f"{mix}_cpu_{k}": v for k, v in cpu.items()})
    return row


# --- probes -------------------------------------------------------------------------------


# --- report -------------------------------------------------------------------------------

PATHS = (("lead", "leads (20 ms buyer)"), ("first", "payments, first deliveries"), ("dup", "payments, duplicate-heavy"))


def med(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return round(statistics.median(values), 3) if values else None


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "—"


def fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:g}"


def render(d: dict) -> str:
    arms = d["arms"]
    machine = ", ".join(f"{k} {v}" for k, v in d["machine"].items())
    lines = [
        "### Side by side",
        "",
        f"Machine: {machine}.",
        "",
        f"{d['rounds']} rounds × {d['seconds']} s per run, arm order rotated each round; wrk 2 threads / 50 "
        "connections; medians over rounds. CPU ms per request from the run's start until the arm's "
        "queue drained. Ratios: Floodgate / plain seed and Floodgate / bare; the bare endpoint answers "
        "leads only, so payments are set against its req/s (in brackets), as bench/levers.py does. "
        "The p50 and p99 are wrk's, which corrects them for coordinated omission before its script "
        "reads them (wrk 4.1's stats_correct: a request that took longer than a connection's mean "
        "cycle adds a sample at each cycle below its own latency), so a rare long stall weighs on "
        "the p99 many times over (bench/REPORT.md part 35).",
        "",
        "| path | measure | bare | Floodgate | plain seed | FG / plain | FG / bare |",
        "|---|---|---|---|---|---|---|",
    ]
    measures = [("rps", "requests/s"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms")]
    measures += [(f"cpu_{p}", f"CPU ms/req: {p}") for p in (*PROCESSES, "all")]
    for path, title in PATHS:
        for key, name in measures:
            k = f"{path}_{key}"
            b, f, p = (med(arms[a], k) for a in ("bare", "floodgate", "plain"))
            if f is None and p is None:
                continue
            shown = fmt(b)
            if path != "lead" and key == "rps":  # payments against the bare endpoint's req/s
                b = med(arms["bare"], "lead_rps")
                shown = f"({fmt(b)})"
            lines.append(f"| {title} | {name} | {shown} | {fmt(f)} | {fmt(p)} | {ratio(f, p)} | {ratio(f, b)} |")
    errors = {
        a: sum(r.get(k, 0) for r in rows for k in ("lead_errors", "first_non_2xx", "dup_non_2xx"))
        for a, rows in arms.items()
    }
    lines += ["", f"wrk errors and non-2xx answers over all runs: {errors}.", ""]
    pr = d.get("probes") or {}
    if pr:
        lines += [
            "### Probes",
            "",
            "| probe | Floodgate | plain seed |",
            "|---|---|---|",
        ]
        a = pr["leads"]
        lines.append(
            "| (a) 30 leads × 3 at once: buyer posts (right: 30) | "
            f"{a['floodgate']['buyer_posts']} ({a['floodgate']['leads_posted_more_than_once']} leads posted twice or more; answers {a['floodgate']['answers']}) | "
            f"{a['plain']['buyer_posts']} ({a['plain']['leads_posted_more_than_once']} leads posted twice or more; answers {a['plain']['answers']}) |"
        )
        b = pr["payment"]

        def pay(x: dict) -> str:
            dup = ", ".join(str(y["status"]) for y in x["duplicates"])
            retry = ", ".join(str(y["status"]) for y in x["retries"]) or "none"
            return (
                f"first {x['first']['status'] if x['first'] else '—'}, duplicates {dup}, retries {retry}; "
                f"ledger rows {x['ledger_rows']}: **{x['outcome']}**"
            )

        lines.append(
            f"| (b) first delivery fails after its duplicates were answered | {pay(b['floodgate'])} | {pay(b['plain'])} |"
        )
    lines += ["", "Every round:", ""]
    keys = [f"{p}_{m}" for p, _ in PATHS for m in ("rps", "p99_ms", "cpu_all")]
    lines += ["| round | arm | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for arm, rows in arms.items():
        for i, r in enumerate(rows, 1):
            lines.append(f"| {i} | {arm} | " + " | ".join(fmt(r.get(k)) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def plot(d: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = d["arms"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.6))
    names = ["bare", "floodgate", "plain"]
    x = range(len(PATHS))
    for i, arm in enumerate(names):
        a.bar([j + (i - 1) * 0.27 for j in x], [med(arms[arm], f"{p}_rps") or 0 for p, _ in PATHS], 0.27, label=arm)
    a.set_xticks(list(x), [t for _, t in PATHS], fontsize=8)
    a.set(ylabel="requests/s (median)", title="Throughput at 50 connections")
    a.legend()
    bottom = {arm: [0.0] * len(PATHS) for arm in names}
    for proc, color in zip(PROCESSES, ("C0", "C1", "C2", "C3")):
        for i, arm in enumerate(names):
            vals = [med(arms[arm], f"{p}_cpu_{proc}") or 0 for p, _ in PATHS]
            b.bar(
                [j + (i - 1) * 0.27 for j in x],
                vals,
                0.27,
                bottom=bottom[arm],
                color=color,
                label=proc if i == 0 else None,
                edgecolor="black",
                hatch=("", "//", "..")[i],
            )
            bottom[arm] = [s + v for s, v in zip(bottom[arm], vals)]
    b.set_xticks(list(x), [t for _, t in PATHS], fontsize=8)
    b.set(ylabel="CPU ms per request", title="CPU per request by process (bare | Floodgate // | plain ..)")
    b.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# --- main ---------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=quick(5, 1))
    ap.add_argument("--seconds", type=int, default=quick(10, 2))
    args = ap.parse_args()
    head = head_rev()
    rng = random.Random(23)
    with worktrees({"floodgate": head}, "fg-versus") as codes:
        code = codes["floodgate"]
        with ExitStack() as es:
            tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="fg-versus-")))
            log("starting Floodgate's stack (with the bare app and the buyer stub) and the plain seed")
            fg = Stack(es, tmp, {**SECRETS, "WEB_CONCURRENCY": "2"}, code=code)
            buyer_url = f"http://127.0.0.1:{fg.buyer.args[-1]}/acme"
            plain_redis = stack_mod.redis(es, tmp, "plain-redis")
            plain_db = stack_mod.database(es, tmp, mysql_only=True)
            plain_env = {**fg.base.env}
            plain = start_plain(es, tmp, plain_env, plain_redis.url, plain_db, buyer_url, "plain")
            plain_worker = Proc(
                [venv_bin("rq"), "worker", "--url", plain_redis.url, "-w", "rq.worker.SimpleWorker", "plain"],
                {**plain_env, "PLAIN_DATABASE_URL": plain_db},
                tmp / "plain-worker.log",
            )
            es.callback(plain_worker.stop)
            queue = Queue("plain", connection=plain_redis.client(decode_responses=False))

            def plain_drained() -> None:
                wait_until(
                    lambda: (
                        queue.count == 0
                        and queue.connection.llen(queue.intermediate_queue_key) == 0
                        and queue.started_job_registry.count == 0
                    ),
                    timeout=300,
                    interval=0.2,
                    what="the plain seed's queue drained",
                )

            arms = [
                Arm("bare", fg.bare_url, lambda: {"web": tree(fg.bare.pid), "db": mariadbd()}, payments=False),
                Arm(
                    "floodgate",
                    fg.web.url,
                    lambda: {
                        "web": tree(fg.web.pid),
                        "redis": [fg.redis.proc.pid],
                        "worker": tree(fg.worker.pid),
                        "db": mariadbd(),
                    },
                    lambda: drained(fg),
                ),
                Arm(
                    "plain",
                    plain.url,  # type: ignore[attr-defined]
                    lambda: {
                        "web": tree(plain.pid),
                        "redis": [plain_redis.proc.pid],
                        "worker": tree(plain_worker.pid),
                        "db": mariadbd(),
                    },
                    plain_drained,
                ),
            ]
            plain_drained()
            for i in range(args.rounds):
                order = arms[i % 3 :] + arms[: i % 3]
                for arm in order:
                    t0 = time.monotonic()
                    arm.rows.append(measure(arm, args.seconds, rng, tmp))
                    log(f"round {i + 1} {arm.name}: {json.dumps(arm.rows[-1])} ({time.monotonic() - t0:.0f} s)")
            log("probe (a): 30 lead ids × 3 at once")
            buyers = BuyerServer()
            es.callback(buyers.close)
            buyers.add("fg", "accept", delay=0.05)
            buyers.add("plain", "accept", delay=0.05)
            fg._configure(buyers.url("fg"))
            probe_plain = start_plain(es, tmp, plain_env, plain_redis.url, plain_db, buyers.url("plain"), "plain-probe")
            buyers.buyers["plain"].arrived.clear()
            buyers.buyers["fg"].arrived.clear()
            leads = {
                "floodgate": probe_leads(fg.web.url, buyers, "fg"),
                "plain": probe_leads(probe_plain.url, buyers, "plain"),  # type: ignore[attr-defined]
            }
            log(f"probe (a): {json.dumps(leads)}")
            log("probe (b): a first delivery failing after its duplicates were answered")
            payment = {
                "floodgate": probe_payment(fg.web.url, fg.db_url, f"probe-fg-{rng.randrange(10**9)}"),
                "plain": probe_payment(plain.url, plain_db, f"probe-plain-{rng.randrange(10**9)}"),  # type: ignore[attr-defined]
            }
            log(f"probe (b): {json.dumps(payment)}")
    data = {
        "rev": head,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "arms": {a.name: a.rows for a in arms},
        "probes": {"leads": leads, "payment": payment},
        "machine": machine_info(),
    }
    write_json("versus.json", data)
    write_md("versus.md", render(data))
    figure = (OUT if QUICK else ROOT / "bench" / "figures") / "versus.png"
    plot(data, figure)
    log(f"wrote {OUT / 'versus.md'} and {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
