"""The per-publisher rate limiter's cost per lead (issue 23 item 5), A/B in one run.

One stack (bench/e2e.py's: 2 gunicorn workers, a buyer answering in ~20 ms, MariaDB, RQ) with
PUBLISHER_RATE_LIMIT=off; the arms differ only in the bench publisher's config, switched
with the admin API between runs and alternated round after round (as bench/levers.py does),
so the machine's noise falls on both alike:

- off: no rate_limit and no default: the lead path makes no limiter call;
- on: rate_limit {"per_second": 100000, "burst": 100000}: lua/take_token.lua runs for every
  lead and never refuses at these rates (the scripts Redis ran per lead tell the arms apart:
  one more in "on").

Each round and arm: wrk at 50 connections against POST /v1/leads, with the web processes' CPU
per lead. Then the script alone: the round trip of Store.take_token against a plain PING on
the same single connection, in alternated blocks. The report gives the medians.

    python -m bench.rate_limit_cost [--rounds 5] [--seconds 8] [--calls 5000]

Writes bench/out/rate_limit_cost.json and rate_limit_cost.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent

from bench.common import OUT, machine_info, redis_version, write_json, write_md
from bench.e2e import ADMIN, API_KEY, Stack, cpu_seconds, log, wrk
from bench.knee import drained
from testkit.config import SECRETS
from webhooks.storage.redis import Store, make_redis

ARMS = {"off": None, "on": {"per_second": 100_000, "burst": 100_000}}
PUBLISHER = "bench"


def set_arm(stack: Stack, rate_limit: dict | None) -> None:
    """Put the bench publisher with `rate_limit` (None: none) and let every worker see it."""
    body = {"name": "Bench", "api_key": API_KEY, "commission_pct": "10"}
    if rate_limit is not None:
        body["rate_limit"] = rate_limit
    requests.put(
        f"{stack.web.url}/v1/admin/publishers/{PUBLISHER}",
        json=body,
        timeout=10,
        headers={"Authorization": f"Bearer {ADMIN}"},
    ).raise_for_status()
    time.sleep(1.2)  # > CONFIG_CHECK_INTERVAL_MS: every web process has the change


def scripts_run(r) -> int:
    """How many Lua scripts Redis has run (EVAL and EVALSHA calls)."""
    stats = r.info("commandstats")
    return sum(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0) for cmd in ("eval", "evalsha"))


def one_run(stack: Stack, arm: str, seconds: int) -> dict:
    """wrk against the lead path in `arm`; leads/s, p99, web CPU and Lua scripts per lead."""
    r = stack.redis.client()
    web = stack.pids()["web (2 gunicorn workers)"]
    before, scripts = cpu_seconds(web), scripts_run(r)
    leads = wrk(stack.web.url, 50, seconds, f"{arm}{time.monotonic_ns()}")
    n = max(1, leads["requests"])
    cpu_ms = (cpu_seconds(web) - before) / n * 1000
    scripts_per_lead = (scripts_run(r) - scripts) / n
    drained(stack)
    return {
        "lead_rps": leads["rps"],
        "lead_p99_ms": leads["p99_ms"],
        "lead_errors": leads["errors"],
        "lead_web_cpu_ms": round(cpu_ms, 3),
        "scripts_per_lead": round(scripts_per_lead, 3),
    }


def script_round_trips(url: str, calls: int, blocks: int) -> dict:
    """µs per call of take_token and of PING on one connection, alternated block by block."""
    store = Store(make_redis(url, max_connections=1))
    store.redis.ping()
    samples: dict[str, list[float]] = {"take_token": [], "ping": []}
    ops = {"take_token": lambda: store.take_token("micro", 100_000, 100_000), "ping": store.redis.ping}
    before = store.redis.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    for i in range(blocks):
        for name in ("take_token", "ping") if i % 2 == 0 else ("ping", "take_token"):
            op = ops[name]
            t0 = time.perf_counter()
            for _ in range(calls):
                op()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    med = {name: round(statistics.median(v), 1) for name, v in samples.items()}
    after = store.redis.info("commandstats")["cmdstat_evalsha"]  # only take_token ran EVALSHA here
    server_us = (after["usec"] - before["usec"]) / max(1, after["calls"] - before["calls"])
    return {
        "calls_per_block": calls,
        "blocks": blocks,
        "median_us": med,
        "extra_us": round(med["take_token"] - med["ping"], 1),
        "server_us": round(server_us, 2),
        "blocks_us": samples,
    }


MEASURES = (
    ("lead_rps", "leads/s (c=50)"),
    ("lead_web_cpu_ms", "web CPU per lead (ms)"),
    ("lead_p99_ms", "lead p99 (ms)"),
    ("scripts_per_lead", "Lua scripts Redis ran per lead"),
)


def render(d: dict) -> str:
    machine = ", ".join(f"{k} {v}" for k, v in d["machine"].items())
    lines = [
        f"Machine: {machine}.",
        "",
        f"{d['rounds']} rounds, arms alternated (off first in odd rounds); wrk at 50 connections, "
        f"{d['seconds']} s per run, buyer ~20 ms. Medians of the rounds; ratio = on / off.",
        "",
        "| measure | off (no limiter call) | on (take_token per lead) | ratio |",
        "|---|---|---|---|",
    ]
    for key, name in MEASURES:
        off = statistics.median(r[key] for r in d["arms"]["off"])
        on = statistics.median(r[key] for r in d["arms"]["on"])
        lines.append(f"| {name} | {off:g} | {on:g} | {on / off:.2f} |" if off else f"| {name} | {off:g} | {on:g} | — |")
    s = d["script"]
    lines += [
        "",
        f"The script alone, one connection, {s['blocks']} alternated blocks of {s['calls_per_block']} "
        "calls (median µs per call):",
        "",
        "| call | µs |",
        "|---|---|",
        f"| `Store.take_token` (EVALSHA lua/take_token.lua) | {s['median_us']['take_token']:g} |",
        f"| `PING` | {s['median_us']['ping']:g} |",
        f"| the script's cost over a bare round trip | {s['extra_us']:g} |",
        f"| of which inside Redis (commandstats, mean per EVALSHA) | {s['server_us']:g} |",
        "",
        "Every round:",
        "",
        "| round | arm | " + " | ".join(k for k, _ in MEASURES) + " | errors |",
        "|---|---|" + "---|" * (len(MEASURES) + 1),
    ]
    for arm, rows in d["arms"].items():
        for i, r in enumerate(rows, 1):
            lines.append(
                f"| {i} | {arm} | " + " | ".join(f"{r[k]:g}" for k, _ in MEASURES) + f" | {r['lead_errors']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    arms: dict[str, list] = {name: [] for name in ARMS}
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="fg-ratelimit-")))
        stack = Stack(es, tmp, {**SECRETS, "WEB_CONCURRENCY": "2", "PUBLISHER_RATE_LIMIT": "off"})
        wrk(stack.web.url, 50, 2, "warm")
        for i in range(args.rounds):
            order = list(ARMS) if i % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                set_arm(stack, ARMS[arm])
                arms[arm].append(one_run(stack, arm, args.seconds))
                log(f"round {i + 1} {arm}: {json.dumps(arms[arm][-1])}")
        extra = statistics.median(r["scripts_per_lead"] for r in arms["on"]) - statistics.median(
            r["scripts_per_lead"] for r in arms["off"]
        )
        if not 0.9 <= extra <= 1.1:
            raise SystemExit(f"the arms differ by {extra:.2f} scripts per lead, not the limiter's one")
        script = script_round_trips(stack.redis.url, args.calls, 10)
        log(f"script: {json.dumps(script['median_us'])}")
        versions = {"redis": redis_version(stack.redis.client())}
    data = {
        "rounds": args.rounds,
        "seconds": args.seconds,
        "arms": arms,
        "script": script,
        "machine": machine_info(**versions),
    }
    write_json("rate_limit_cost.json", data)
    write_md("rate_limit_cost.md", render(data))
    log(f"wrote {OUT / 'rate_limit_cost.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
