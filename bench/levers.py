"""One lever at a time, A/B in one run: the same stack (bench/e2e.py's) started once per arm,
the arms alternated round after round so the machine's noise falls on both alike.

Each round and arm: wrk at 50 connections against the bare endpoint, the lead path (20 ms
buyer) and payment deliveries (2,000 payments × 5, shuffled; bench/pay.lua), with the web
processes' CPU per request. The report gives each arm's medians and the ratio of the
medians, lever over base.

    python -m bench.levers [--rounds 3] [--seconds 10] [--lever hiredis]

Levers:
- hiredis: redis-py's parser. redis-py uses hiredis when it can import it; the base arm runs
  with bench/no_hiredis/ first on PYTHONPATH (a `hiredis` that fails to import), so both arms
  run the same installed code.

Writes bench/out/levers.json and levers.md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from bench.common import OUT, machine_info, write_json, write_md
from bench.e2e import Stack, cpu_seconds, log, wrk
from bench.knee import drained, lua_list, make_deliveries, wrk_payments
from testkit.config import SECRETS

LEVERS = {
    # lever: (base arm's extra env, lever arm's extra env)
    "hiredis": ({"PYTHONPATH": str(ROOT / "bench" / "no_hiredis")}, {}),
}


def one_arm(env: dict, seconds: int, rng: random.Random) -> dict:
    """Start the stack with `env`, measure the three runs, stop it."""
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="fg-lever-")))
        stack = Stack(es, tmp, {**SECRETS, "WEB_CONCURRENCY": "2", **env})
        web = stack.pids()["web (2 gunicorn workers)"]
        wrk(stack.bare_url, 50, 2, "warm")
        wrk(stack.web.url, 50, 2, "warm")
        bare = wrk(stack.bare_url, 50, seconds, "bare")
        before = cpu_seconds(web)
        leads = wrk(stack.web.url, 50, seconds, "leads")
        lead_cpu = (cpu_seconds(web) - before) / max(1, leads["requests"]) * 1000
        drained(stack)
        deliveries, _ = make_deliveries(f"lever{rng.randrange(10**9)}", 2000, rng)
        listing = tmp / "deliveries.lua"
        lua_list(deliveries, listing)
        before = cpu_seconds(web)
        pay = wrk_payments(stack.web.url, listing, 50, seconds)
        pay_cpu = (cpu_seconds(web) - before) / max(1, pay["requests"]) * 1000
        drained(stack)
    return {
        "bare_rps": bare["rps"],
        "lead_rps": leads["rps"],
        "lead_p99_ms": leads["p99_ms"],
        "lead_errors": leads["errors"],
        "lead_web_cpu_ms": round(lead_cpu, 3),
        "pay_rps": pay["rps"],
        "pay_p99_ms": pay["p99_ms"],
        "pay_non_2xx": pay["non_2xx_or_errors"],
        "pay_web_cpu_ms": round(pay_cpu, 3),
        "lead_ratio": round(leads["rps"] / bare["rps"], 3),
        "pay_ratio": round(pay["rps"] / bare["rps"], 3),
    }


MEASURES = (
    ("lead_rps", "leads/s (c=50)"),
    ("lead_ratio", "lead path / bare"),
    ("lead_web_cpu_ms", "web CPU per lead (ms)"),
    ("lead_p99_ms", "lead p99 (ms)"),
    ("pay_rps", "deliveries/s (c=50)"),
    ("pay_ratio", "payments / bare"),
    ("pay_web_cpu_ms", "web CPU per delivery (ms)"),
    ("pay_p99_ms", "payment p99 (ms)"),
    ("bare_rps", "bare endpoint req/s"),
)


def render(d: dict) -> str:
    lever = d["lever"]
    machine = ", ".join(f"{k} {v}" for k, v in d["machine"].items())
    lines = [
        f"### Lever: {lever}",
        "",
        f"Machine: {machine}.",
        "",
        f"{d['rounds']} rounds, arms alternated (base first in odd rounds); wrk at 50 connections, "
        f"{d['seconds']} s per run. Medians of the rounds; ratio = {lever} / base.",
        "",
        f"| measure | base | {lever} | ratio |",
        "|---|---|---|---|",
    ]
    for key, name in MEASURES:
        b = statistics.median(r[key] for r in d["arms"]["base"])
        a = statistics.median(r[key] for r in d["arms"][lever])
        lines.append(f"| {name} | {b:g} | {a:g} | {a / b:.2f} |" if b else f"| {name} | {b:g} | {a:g} | — |")
    lines += [
        "",
        "Every round:",
        "",
        "| round | arm | " + " | ".join(k for k, _ in MEASURES) + " |",
        "|---|---|" + "---|" * len(MEASURES),
    ]
    for arm, rows in d["arms"].items():
        for i, r in enumerate(rows, 1):
            lines.append(f"| {i} | {arm} | " + " | ".join(f"{r[k]:g}" for k, _ in MEASURES) + " |")
    errors = sum(r["lead_errors"] + r["pay_non_2xx"] for rows in d["arms"].values() for r in rows)
    lines += ["", f"Errors and non-2xx answers in all runs: {errors}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lever", choices=sorted(LEVERS), default="hiredis")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    args = ap.parse_args()
    base_env, lever_env = LEVERS[args.lever]
    arms: dict[str, list] = {"base": [], args.lever: []}
    rng = random.Random(16)
    for i in range(args.rounds):
        order = [("base", base_env), (args.lever, lever_env)]
        if i % 2:
            order.reverse()
        for name, env in order:
            t0 = time.monotonic()
            arms[name].append(one_arm(env, args.seconds, rng))
            log(f"round {i + 1} {name}: {json.dumps(arms[name][-1])} ({time.monotonic() - t0:.0f} s)")
    data = {
        "lever": args.lever,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "arms": arms,
        "machine": machine_info(),
    }
    write_json("levers.json", data)
    write_md("levers.md", render(data))
    log(f"wrote {OUT / 'levers.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
