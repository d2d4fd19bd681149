"""Latency over offered rate for both paths (the knee), and payment throughput against the bare
endpoint, in one run on one stack (bench/stack.py's Stack: Redis, MariaDB, a buyer answering in ~20 ms,
Floodgate with 2 gunicorn workers, an RQ worker, and the bare Flask app on the same settings).

1. wrk at 50 connections: the bare endpoint, then payment deliveries (2,000 payments, each
   delivered 5 times, shuffled; bench/pay.lua), back to back: deliveries/s and the ratio.
2. Open loop (bench/openloop.py, latency from the moment each request was due) at stepped
   offered rates, for payment deliveries (fresh payments each step, 5 deliveries each,
   shuffled) and for leads.
3. The invariants of the same runs: every wallet equals the sum of its distinct payments (no
   double credit, none lost), every payment answered `credited` once, every lead settled,
   and both queues (settlements, delivery audit rows) drained.

    python -m bench.knee [--steps-seconds 10] [--payment-rates 100,...] [--lead-rates 100,...]
Writes bench/out/knee.json, knee.md and knee.png.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from bench.bench_payments import make_payments
from bench.common import OUT, machine_info, mysql_version, quick, redis_version, write_json, write_md
from bench.knee_report import plot, render
from bench.stack import API_KEY, Stack, cpu_seconds, drained, log, lua_list, warm, wrk, wrk_payments
from testkit.config import SECRETS
from testkit.payments import signed_headers
from testkit.servers import venv_bin
from webhooks.storage.live import keys

REPEATS = 5


def make_deliveries(tag: str, payments: int, rng: random.Random, repeats: int = REPEATS) -> tuple[list, dict]:
    """(deliveries [(provider, headers, body)]: each payment signed once and sent `repeats`
    times, all shuffled; expected wallet balances)."""
    made, expected = make_payments(payments, tag, rng)
    out = []
    for _reference, provider, raw in made:
        out += [(provider, signed_headers(provider, raw), raw.decode())] * repeats
    rng.shuffle(out)
    return out, dict(expected)


class Watch:
    """Samples both queues (settlements, delivery audit rows) while a step runs."""

    def __init__(self, client):
        self.client, self.peak, self._stop = client, Counter(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, key in (("settlements", keys.SETTLE_PENDING), ("audit_rows", keys.WEBHOOK_CALLS_PENDING)):
                self.peak[name] = max(self.peak[name], self.client.llen(key))
            self._stop.wait(0.25)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return dict(self.peak)


def step_cpu(stack: Stack, pids: dict[str, list[int]], args: list[str], timeout: float) -> tuple[dict, dict]:
    """(the open-loop step's result with the seconds its queues took to drain after it, CPU ms
    per answered request by process, the load generator's own included): what the step's
    rate cost each process on the shared cores, the drain of what it queued included."""
    before = {n: cpu_seconds(p) for n, p in pids.items()}
    gen = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = openloop(args, timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["drain_s"] = drained(stack)
    used = {n: cpu_seconds(p) - before[n] for n, p in pids.items()}
    used["load generator"] = after.ru_utime + after.ru_stime - gen.ru_utime - gen.ru_stime
    done = max(1, result["answered"])  # a request the generator gave up on (10 s) is no answer
    return result, {n: round(s / done * 1000, 3) for n, s in used.items()}


def openloop(args: list[str], timeout: float) -> dict:
    return json.loads(
        subprocess.run(
            [venv_bin("python"), "-m", "bench.openloop", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout,
        ).stdout
    )


def check_payments(db_url: str, expected: dict, payments: int) -> dict:
    """Each wallet against the payments the ledger holds for it (each credited once: none
    twice, none lost after its row), and the payment rows against the payments sent (wrk stops
    after its seconds, so some of its payments may never have been sent)."""
    import peewee as pw

    from webhooks.storage.records.db import db, init_db
    from webhooks.storage.records.models import Payment, Wallet

    init_db(db_url, 2)
    with db.connection_context():
        wallets = {(w.customer, w.currency): w.balance_minor for w in Wallet.select()}
        rows = Payment.select().count()
        held = {
            (customer, currency): int(total)
            for customer, currency, total in Payment.select(
                Payment.customer, Payment.currency, pw.fn.SUM(Payment.amount_minor)
            )
            .group_by(Payment.customer, Payment.currency)
            .tuples()
        }
    off = sum(1 for k, v in held.items() if wallets.get(k) != v)
    return {
        "payments_expected": payments,
        "payment_rows": rows,
        "wallets_checked": len(held),
        "wallets_off": off,
        "unexpected_wallets": len(set(wallets) - set(expected)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=10, help="each wrk run")
    ap.add_argument("--step-seconds", type=float, default=10, help="each open-loop step")
    ap.add_argument("--payment-rates", default="100,200,300,400,500,600,800")
    ap.add_argument("--lead-rates", default="100,200,300,400,500,600")
    ap.add_argument(
        "--payment-repeats",
        type=int,
        default=REPEATS,
        help="deliveries of each payment in the open-loop steps (1: every request a first delivery)",
    )
    ap.add_argument("--render", action="store_true", help="only write knee.md and knee.png from knee.json")
    ap.add_argument("--before", metavar="JSON", help="with --render: a knee.json of older code to compare")
    ap.add_argument("--before-commit", default="?", help="the commit that JSON measured")
    args = ap.parse_args()
    if args.render:
        data = json.loads((OUT / "knee.json").read_text())
        if args.before:
            data["before"] = json.loads(Path(args.before).read_text())
            data["before"]["commit"] = args.before_commit
            write_json("knee.json", data)
        write_md("knee.md", render(data))
        plot(data, OUT / "knee.png")
        return 0
    rng = random.Random(16)
    expected: dict = defaultdict(int)
    total_payments, first_answers = 0, Counter()
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="fg-knee-")))
        log("starting redis, database, buyer stub, Floodgate, worker and the bare app")
        stack = Stack(es, tmp, {**SECRETS, "WEB_CONCURRENCY": "2"})
        pids = stack.pids()

        # 1. throughput at 50 connections against the bare endpoint
        deliveries, exp = make_deliveries("wrk", quick(2000, 100), rng)
        total_payments += quick(2000, 100)
        for k, v in exp.items():
            expected[k] += v
        listing = tmp / "deliveries.lua"
        lua_list(deliveries, listing)
        warm(stack.bare_url, 50, "warm")
        bare = wrk(stack.bare_url, 50, args.seconds, "bare")
        log(f"bare: {bare}")
        before = {n: cpu_seconds(p) for n, p in pids.items()}
        pay = wrk_payments(stack.web.url, listing, 50, args.seconds)
        cpu = {n: round((cpu_seconds(p) - before[n]) / max(1, pay["requests"]) * 1000, 3) for n, p in pids.items()}
        log(f"payments: {pay}")
        throughput = {
            "bare": bare,
            "payments": pay,
            "ratio": round(pay["rps"] / bare["rps"], 3),
            "cpu_ms_per_delivery": cpu,
            "drain_s": drained(stack),
        }

        # 2. open loop, stepped
        pay_steps, lead_steps = [], []
        for rate in (float(x) for x in args.payment_rates.split(",")):
            n = int(rate * args.step_seconds / args.payment_repeats)
            deliveries, exp = make_deliveries(f"ol{int(rate)}", n, rng, args.payment_repeats)
            total_payments += n
            for k, v in exp.items():
                expected[k] += v
            path = tmp / f"ol{int(rate)}.json"
            path.write_text(json.dumps(deliveries))
            watch = Watch(stack.redis.client())
            result, cpu = step_cpu(
                stack, pids, ["payments", stack.web.url, str(path), str(rate)], args.step_seconds + 120
            )
            peaks = watch.stop()
            first_answers.update(result["statuses"])
            step = {**result, "queue_peaks": peaks, "payments": n, "cpu_ms": cpu}
            log(
                f"payments open loop {rate}/s: p50 {result['p50_ms']} p99 {result['p99_ms']} "
                f"achieved {result['achieved_rate']} {result['statuses']} peaks {peaks}"
            )
            pay_steps.append(step)
        for rate in (float(x) for x in args.lead_rates.split(",")):
            watch = Watch(stack.redis.client())
            result, cpu = step_cpu(
                stack, pids, [stack.web.url, API_KEY, str(rate), str(args.step_seconds)], args.step_seconds + 120
            )
            peaks = watch.stop()
            step = {**result, "queue_peaks": peaks, "cpu_ms": cpu}
            log(
                f"leads open loop {rate}/s: p50 {result['p50_ms']} p99 {result['p99_ms']} "
                f"achieved {result['achieved_rate']} {result['statuses']} peaks {peaks}"
            )
            lead_steps.append(step)

        invariants = check_payments(stack.db_url, expected, total_payments)
        invariants["credited_answers_open_loop"] = first_answers.get("credited", 0)
        invariants.update(check_leads(stack.db_url, lead_steps))
        versions = {"redis": redis_version(stack.redis.client())}
        if stack.db_url.startswith("mysql://"):
            import pymysql

            conn = pymysql.connect(host="127.0.0.1", user="root")
            versions["database"] = mysql_version(conn)
            conn.close()
    data = {
        "machine": machine_info(**versions),
        "throughput": throughput,
        "payments": pay_steps,
        "leads": lead_steps,
        "invariants": invariants,
        "step_seconds": args.step_seconds,
        "payment_repeats": args.payment_repeats,
    }
    write_json("knee.json", data)
    write_md("knee.md", render(data))
    plot(data, OUT / "knee.png")
    log(f"wrote {OUT / 'knee.md'}")
    return 0 if invariants["wallets_off"] == 0 and invariants["leads_missing"] == 0 else 1


def check_leads(db_url: str, steps: list[dict], timeout_s: float = 60) -> dict:
    """Every lead answered sold or unsold in the open-loop steps is in the ledger, within
    `timeout_s`: an empty settlement queue does not mean its last batch is written yet (the
    worker takes a batch off the list, then writes it), so the count is awaited, not read once."""
    from webhooks.storage.records.db import db
    from webhooks.storage.records.models import Lead

    answered = sum(s["statuses"].get("sold", 0) + s["statuses"].get("unsold", 0) for s in steps)

    def settled() -> int:
        with db.connection_context():
            return Lead.select().where(Lead.lead_id.startswith("ol")).count()

    deadline = time.monotonic() + timeout_s
    count = settled()
    while count < answered and time.monotonic() < deadline:
        time.sleep(0.2)
        count = settled()
    return {"leads_answered": answered, "leads_settled": count, "leads_missing": max(0, answered - count)}


if __name__ == "__main__":
    sys.exit(main())
