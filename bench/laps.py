"""Where a payment webhook waits under load: the Server-Timing laps of every answer (docs/payments.md),
read from gunicorn's access log, for credits and duplicates apart, at each DB_POOL_SIZE asked for.

    python -m bench.laps [--seconds 10] [--pools 10,25] [--mix dup]

bench/e2e.py's stack per pool size (2 web workers), with the access log writing each answer's
Server-Timing; wrk drives the payment path at 50 connections, the `dup` mix (2,000 Paystack
payments of 200 payers × 5 deliveries, shuffled, as bench/versus.py's duplicate-heavy run) or
`first` (6,000 × 5 of 500 payers). Writes bench/out/laps.md and laps.json: per lap, the p50, p90
and p99 over the run's answers, and wrk's own figures. A credit is told from a duplicate by its
laps: only an answer that moved money has `db_wait` (these mixes hold no refunds).
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

from bench.common import OUT, machine_info, percentiles, quick, write_json, write_md
from bench.e2e import Stack, log, warm
from bench.knee import drained, lua_list, wrk_payments
from bench.levers import first_deliveries
from testkit.config import SECRETS

# One line per answer: its path and status, then its Server-Timing (a header Floodgate writes).
ACCESS_FORMAT = "%(U)s %(s)s [%({server-timing}o)s]"
_LINE = re.compile(r"^/v1/webhooks/\w+ (\d{3}) \[(.*)\]$")
_LAP = re.compile(r"(\w+);dur=([\d.]+)")
LAPS = ("verify", "parse", "dedupe", "db_wait", "ledger", "release", "total")
MIXES = {"dup": (quick(2000, 100), 200), "first": (quick(6000, 100), 500)}  # payments, payers


def read_laps(access_log: Path) -> dict[str, dict[str, list[float]]]:
    """Per kind of answer (credit, duplicate or other), each lap's durations in ms."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line in access_log.read_text().splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        laps = {name: float(ms) for name, ms in _LAP.findall(m.group(2))}
        kind = "credit" if "db_wait" in laps else "duplicate" if m.group(1) == "200" else "other"
        for name, ms in laps.items():
            out[kind][name].append(ms)
    return out


def one_pool(pool: int, seconds: int, mix: str, rng: random.Random) -> dict:
    payments, payers = MIXES[mix]
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="fg-laps-")))
        access = tmp / "access.log"
        env = {
            **SECRETS,
            "DB_POOL_SIZE": str(pool),
            "ACCESS_LOG": str(access),
            "GUNICORN_CMD_ARGS": f"--access-logformat '{ACCESS_FORMAT}'",
        }
        stack = Stack(es, tmp, env)
        warm(stack.web.url, 50, "warm")
        listing = tmp / "deliveries.lua"
        lua_list(first_deliveries(f"laps{rng.randrange(10**9)}", payments, rng, payers=payers), listing)
        access.write_text("")  # the warm-up's leads are not counted
        result = wrk_payments(stack.web.url, listing, 50, seconds)
        drained(stack)
        laps = read_laps(access)
    return {
        "pool": pool,
        "wrk": result,
        "answers": {kind: len(by.get("total", [])) for kind, by in laps.items()},
        "laps": {kind: {name: percentiles(v, (50, 90, 99)) for name, v in by.items()} for kind, by in laps.items()},
    }


def render(d: dict) -> str:
    lines = [
        f"Machine: {', '.join(f'{k} {v}' for k, v in d['machine'].items())}.",
        "",
        f"The `{d['mix']}` mix, wrk 2 threads / 50 connections, {d['seconds']} s per pool size; each answer's "
        "Server-Timing laps from gunicorn's access log, in ms (p50 / p90 / p99 over the run).",
        "",
        "| DB_POOL_SIZE | wrk req/s | wrk p50 / p99 ms | answers (credits, duplicates) | kind | "
        + " | ".join(LAPS)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(LAPS),
    ]
    for run in d["runs"]:
        w = run["wrk"]
        for kind in ("credit", "duplicate"):
            laps = run["laps"].get(kind, {})
            cells = [
                "—" if name not in laps else " / ".join(f"{laps[name][p]:.1f}" for p in ("p50", "p90", "p99"))
                for name in LAPS
            ]
            head = (
                f"| {run['pool']} | {w['rps']} | {w['p50_ms']:.1f} / {w['p99_ms']:.1f} | "
                f"{run['answers'].get('credit', 0)}, {run['answers'].get('duplicate', 0)} | {kind} |"
            )
            lines.append(head + " " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--pools", default="10,25", help="DB_POOL_SIZE values, one run each, in this order")
    parser.add_argument("--mix", choices=sorted(MIXES), default="dup")
    args = parser.parse_args()
    rng = random.Random(41)
    runs = []
    for pool in [int(p) for p in args.pools.split(",")]:
        log(f"DB_POOL_SIZE {pool}: {args.mix} mix for {args.seconds} s")
        runs.append(one_pool(pool, args.seconds, args.mix, rng))
        log(f"DB_POOL_SIZE {pool}: {runs[-1]['wrk']}")
    data = {"mix": args.mix, "seconds": args.seconds, "runs": runs, "machine": machine_info()}
    write_json("laps.json", data)
    write_md("laps.md", render(data))
    log(f"wrote {OUT / 'laps.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
