"""One lever at a time, A/B in one run: the same stack (bench/stack.py's Stack) started once per arm,
the arms alternated round after round so the machine's noise falls on both alike.

Each round and arm: wrk at 50 connections against the bare endpoint, the lead path (20 ms
buyer) and payment deliveries, with the web processes' CPU per request. Payments (`--mix`):
`first` (default), 6,000 Paystack payments × 5 deliveries, shuffled: in 10 s most requests
are the first delivery of their payment, each a durable credit; `knee`, 2,000 payments of
every provider × 5 (bench/knee.py's, duplicate-heavy). The report gives each arm's medians and
the ratio of the medians, lever over base.

    python -m bench.levers [--rounds 3] [--seconds 10] [--mix first] [--lever hiredis]
    python -m bench.levers --lever code --base-rev <git revision> --what "<the change>"
    python -m bench.levers ... --env PUBLISHER_RATE_LIMIT=100000/100000   (both arms)

Levers:
- hiredis: redis-py's parser. redis-py uses hiredis when it can import it; the base arm runs
  with bench/no_hiredis/ first on PYTHONPATH (a `hiredis` that fails to import), so both arms
  run the same installed code.
- access_log: gunicorn's access log (ACCESS_LOG, a line per request, to a file) against none.
- worker_connections: WORKER_CONNECTIONS 100 against the default 1000 greenlets per worker.
- workers: 3 gunicorn workers against 2 on the machine's 2 cores (the bare endpoint keeps 2).
- db_pool: DB_POOL_SIZE 25 against the default 10 database connections per process (at 50
  connections each of the 2 workers holds about 25 requests at once).
- http_parser: gunicorn's C request parser (gunicorn_h1c, picohttpparser; `--http-parser fast`)
  against its pure-Python one (`--http-parser python`). Needs `pip install gunicorn_h1c`: not
  in requirements.txt, as it did not pay (bench/REPORT.md part 34).
- code: a change of the code itself: the base arm runs a git worktree of `--base-rev` (its
  processes started in that checkout, the same virtualenv), the lever arm one of HEAD.

Every arm runs committed code from a worktree, so files edited during the run change nothing.

Writes bench/out/levers.json and levers.md.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from bench.common import OUT, head_rev, machine_info, quick, worktrees, write_json, write_md
from bench.knee import make_deliveries
from bench.stack import Stack, cpu_seconds, drained, first_deliveries, log, lua_list, warm, wrk, wrk_payments
from testkit.config import SECRETS

LEVERS = {
    # lever: (base arm's extra env, lever arm's extra env)
    "hiredis": ({"PYTHONPATH": str(ROOT / "bench" / "no_hiredis")}, {}),
    "access_log": ({}, {"ACCESS_LOG": "/tmp/fg-lever-access.log"}),
    "worker_connections": ({}, {"WORKER_CONNECTIONS": "100"}),
    "workers": ({}, {"WEB_CONCURRENCY": "3"}),
    "db_pool": ({}, {"DB_POOL_SIZE": "25"}),
    "http_parser": ({"GUNICORN_CMD_ARGS": "--http-parser python"}, {"GUNICORN_CMD_ARGS": "--http-parser fast"}),
    "code": ({}, {}),
}
PAYSTACK_FIRST = quick(6000, 100)  # payments of the `first` mix


def cpu_per_request(groups: dict[str, list[int]], run: Callable[[], dict]) -> tuple[dict, dict[str, float]]:
    """`run()` (a wrk run) and its CPU ms per request: of the web workers, of every process of
    the stack, and of MariaDB's."""
    charged = {
        "web": groups["web (2 gunicorn workers)"],
        "all": [pid for pids in groups.values() for pid in pids],
        "db": groups["mariadbd"],
    }
    before = {name: cpu_seconds(pids) for name, pids in charged.items()}
    result = run()
    n = max(1, result["requests"])
    return result, {name: round((cpu_seconds(pids) - before[name]) / n * 1000, 3) for name, pids in charged.items()}


def one_arm(env: dict, seconds: int, rng: random.Random, mix: str = "first", code: Path = ROOT) -> dict:
    """Start the stack (of the checkout `code`) with `env`, measure the three runs, stop it."""
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="fg-lever-")))
        stack = Stack(es, tmp, {**SECRETS, "WEB_CONCURRENCY": "2", **env}, code=code)
        groups = stack.pids()
        warm(stack.bare_url, 50, "warm")
        warm(stack.web.url, 50, "warm")
        bare = wrk(stack.bare_url, 50, seconds, "bare")
        leads, lead_cpu = cpu_per_request(groups, lambda: wrk(stack.web.url, 50, seconds, "leads"))
        drained(stack)
        tag = f"lever{rng.randrange(10**9)}"
        if mix == "first":
            deliveries = first_deliveries(tag, PAYSTACK_FIRST, rng)
        else:
            deliveries, _ = make_deliveries(tag, quick(2000, 100), rng)
        listing = tmp / "deliveries.lua"
        lua_list(deliveries, listing)
        pay, pay_cpu = cpu_per_request(groups, lambda: wrk_payments(stack.web.url, listing, 50, seconds))
        drained(stack)
    return {
        "bare_rps": bare["rps"],
        "lead_rps": leads["rps"],
        "lead_p99_ms": leads["p99_ms"],
        "lead_errors": leads["errors"],
        "lead_web_cpu_ms": lead_cpu["web"],
        "lead_all_cpu_ms": lead_cpu["all"],
        "pay_rps": pay["rps"],
        "pay_p99_ms": pay["p99_ms"],
        "pay_non_2xx": pay["non_2xx_or_errors"],
        "pay_web_cpu_ms": pay_cpu["web"],
        "pay_all_cpu_ms": pay_cpu["all"],
        "pay_db_cpu_ms": pay_cpu["db"],
        "lead_ratio": round(leads["rps"] / bare["rps"], 3),
        "pay_ratio": round(pay["rps"] / bare["rps"], 3),
    }


MEASURES = (
    ("lead_rps", "leads/s (c=50)"),
    ("lead_ratio", "lead path / bare"),
    ("lead_web_cpu_ms", "web CPU per lead (ms)"),
    ("lead_all_cpu_ms", "CPU per lead, every process of the stack (ms)"),
    ("lead_p99_ms", "lead p99 (ms)"),
    ("pay_rps", "deliveries/s (c=50)"),
    ("pay_ratio", "payments / bare"),
    ("pay_web_cpu_ms", "web CPU per delivery (ms)"),
    ("pay_all_cpu_ms", "CPU per delivery, every process of the stack (ms)"),
    ("pay_db_cpu_ms", "MariaDB's CPU per delivery (ms)"),
    ("pay_p99_ms", "payment p99 (ms)"),
    ("bare_rps", "bare endpoint req/s"),
)


def render(d: dict) -> str:
    lever = d["lever"]
    machine = ", ".join(f"{k} {v}" for k, v in d["machine"].items())
    lines = [
        f"### Lever: {lever}" + (f": {d['what']}" if d.get("what") else ""),
        "",
        f"Machine: {machine}.",
        "",
        f"{d['rounds']} rounds, arms alternated (base first in odd rounds); wrk at 50 connections, "
        f"{d['seconds']} s per run. Medians of the rounds; ratio = {lever} / base. Payments: the "
        f"`{d.get('mix', 'knee')}` mix"
        + (f"; base arm at {d['base_rev']}, {lever} arm at {d['lever_rev']}" if d.get("base_rev") else "")
        + "".join(f"; {k}={v} in both arms" for k, v in d.get("env", {}).items())
        + ".",
        "",
        f"| measure | base | {lever} | ratio |",
        "|---|---|---|---|",
    ]
    measures = [(k, n) for k, n in MEASURES if all(k in r for rows in d["arms"].values() for r in rows)]
    for key, name in measures:
        b = statistics.median(r[key] for r in d["arms"]["base"])
        a = statistics.median(r[key] for r in d["arms"][lever])
        lines.append(f"| {name} | {b:g} | {a:g} | {a / b:.2f} |" if b else f"| {name} | {b:g} | {a:g} | — |")
    lines += [
        "",
        "Every round:",
        "",
        "| round | arm | " + " | ".join(k for k, _ in measures) + " |",
        "|---|---|" + "---|" * len(measures),
    ]
    for arm, rows in d["arms"].items():
        for i, r in enumerate(rows, 1):
            lines.append(f"| {i} | {arm} | " + " | ".join(f"{r[k]:g}" for k, _ in measures) + " |")
    errors = sum(r["lead_errors"] + r["pay_non_2xx"] for rows in d["arms"].values() for r in rows)
    lines += ["", f"Errors and non-2xx answers in all runs: {errors}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lever", choices=sorted(LEVERS), default="hiredis")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--mix", choices=("first", "knee"), default="first")
    ap.add_argument("--base-rev", help="--lever code: the revision the base arm runs")
    ap.add_argument("--what", help="what the lever changes, for the report's heading (--lever code)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set in both arms")
    args = ap.parse_args()
    if any("=" not in pair for pair in args.env):
        ap.error("--env takes KEY=VALUE")
    both = dict(pair.split("=", 1) for pair in args.env)
    base_env, lever_env = ({**both, **env} for env in LEVERS[args.lever])
    if args.lever == "code" and not args.base_rev:
        ap.error("--lever code needs --base-rev")
    # Both arms run committed code from worktrees (the lever arm HEAD's), never the files
    # being edited while the run goes on.
    head = head_rev()
    revs = {"base": args.base_rev or head, args.lever: head}
    arms: dict[str, list] = {"base": [], args.lever: []}
    rng = random.Random(16)
    with worktrees(revs, "fg-lever") as codes:
        for i in range(args.rounds):
            order = [("base", base_env), (args.lever, lever_env)]
            if i % 2:
                order.reverse()
            for name, env in order:
                t0 = time.monotonic()
                arms[name].append(one_arm(env, args.seconds, rng, args.mix, codes[name]))
                log(f"round {i + 1} {name}: {json.dumps(arms[name][-1])} ({time.monotonic() - t0:.0f} s)")
    data = {
        "lever": args.lever,
        "base_rev": args.base_rev,
        "lever_rev": revs[args.lever],
        "mix": args.mix,
        "what": args.what,
        "env": both,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "arms": arms,
        "machine": machine_info(),
    }
    name = f"levers-{args.lever}" + (f"-{args.base_rev}" if args.lever == "code" else "")
    write_json(f"{name}.json", data)
    write_json("levers.json", data)
    write_md(f"{name}.md", render(data))
    write_md("levers.md", render(data))
    log(f"wrote {OUT / 'levers.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
