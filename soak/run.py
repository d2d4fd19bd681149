"""Soak under faults: the whole Procfile stack for minutes to hours under mixed traffic while
processes die, then check that nothing was lost, doubled or over a cap (issue 17).

    scripts/soak [--minutes 10] [--lead-rate 150] [--payment-rate 60] [--galera]

The stack: a private redis-server; a throw-away MariaDB database reached through a TCP proxy
(testkit/servers.TcpProxy, in a process of its own: soak/dbproxy.py) that can cut it; gunicorn with 2 gevent workers (WEB_CONCURRENCY=2,
the Procfile's `web`); the RQ worker and the scheduler (`python -m workers.schedule`), each
restarted 2 s after it dies by a small supervisor (as scripts/run does); four buyers and the
payment-events receiver (soak/buyers.py); and the traffic from a process of its own
(soak/traffic.py). On a schedule it injects, and logs the time of, six faults in turn:
kill -9 of a gunicorn worker, a buyer hanging for 30 s, kill -9 of the RQ worker, the database
unreachable for 10 s, kill -9 of the scheduler, Redis restarted empty; one round per 10
minutes of run. soak/checks.py then checks the invariants, soak/report.py writes them up;
soak/stack.py holds the processes.

With --galera the ledger is a 3-node Galera cluster behind HAProxy (testkit/galera.py), the
database proxy in front of HAProxy (the outage cuts the stack off the whole cluster), and a
seventh fault joins the round: kill -9 of the node HAProxy writes to, restarted once the stack
sells and credits again through a backup (issue 66).

Writes bench/out/soak-<N>m.{json,md,png} and bench/out/soak.{md,png} (the Soak part of
bench/REPORT.md: `python -m bench.report --part soak`); logs of every process under
bench/out/soak-run-<N>m/. Exit status 0 when every invariant holds, 1 when one does not
(the output names it), 2 when the stack could not be set up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

import redis
import requests

from bench.common import machine_info, redis_version
from soak import checks as soak_checks
from soak import report as soak_report
from soak.report import OUT
from soak.stack import API_KEY, BUYER_TIMEOUT_MS, PUBLISHER, Sampler, Stack
from testkit.payments import child_pids
from testkit.servers import Proc, venv_bin
from webhooks.storage.live import keys

# writer_kill only with --galera; second in the round, so that a one-minute run sells through
# the new writer before it stops sending
FAULTS = (
    "web_worker_kill",
    "writer_kill",
    "buyer_hang",
    "rq_worker_kill",
    "db_outage",
    "scheduler_kill",
    "redis_restart",
)
HANG_S, DB_OUTAGE_S = 30, 10
PROBE_TIMEOUT_S = 900


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Faults:
    """Injects the faults on schedule; each fault's probe records when it healed."""

    def __init__(self, stack: Stack, t0: float):
        self.stack, self.t0 = stack, t0
        self.log: list[dict] = []
        self.threads: list[threading.Thread] = []

    def rel(self) -> float:
        return round(time.time() - self.t0, 2)

    def inject(self, kind: str) -> dict:
        fault = {"kind": kind, "t": self.rel(), "milestones": {}}
        self.log.append(fault)
        fault["detail"] = getattr(self, kind)(fault)
        log(f"fault {len(self.log)}: {kind} at {fault['t']} s ({fault['detail']})")
        return fault

    def mark(self, fault: dict, name: str, predicate=lambda: True) -> bool:
        """Record milestone `name` of `fault` when `predicate()` first holds (None: never)."""
        held = seconds_until(predicate, PROBE_TIMEOUT_S) is not None
        fault["milestones"][name] = round(self.rel() - fault["t"], 2) if held else None
        return held

    def later(self, steps) -> None:
        """Run `steps` (marks, in order) in a thread of its own."""
        thread = threading.Thread(target=steps, daemon=True)
        thread.start()
        self.threads.append(thread)

    def probe(self, fault: dict, name: str, predicate) -> None:
        self.later(lambda: self.mark(fault, name, predicate))

    def web_worker_kill(self, fault: dict) -> str:
        before = child_pids(self.stack.web.pid)
        os.kill(before[0], signal.SIGKILL)
        self.probe(fault, "healed", lambda: len(now := child_pids(self.stack.web.pid)) == 2 and set(now) - set(before))
        return f"pid {before[0]}"

    def buyer_hang(self, fault: dict) -> str:
        requests.get(f"http://127.0.0.1:{self.stack.buyer_port}/_hang/acme/{HANG_S}", timeout=5)
        end = time.time() + HANG_S

        def accepting_again():
            stats = requests.get(f"http://127.0.0.1:{self.stack.buyer_port}/_stats", timeout=5).json()
            return stats["last_accept"].get("acme", 0) > end

        self.probe(fault, "healed", accepting_again)
        return f"acme holds every post {HANG_S} s unanswered"

    def rq_worker_kill(self, fault: dict) -> str:
        pid = self.stack.worker.pid
        r = self.stack.redis_client()
        orphans = list(r.scan_iter(match=keys.settle_processing("*"), count=1000))
        held = sum(r.llen(k) for k in orphans)
        os.kill(pid, signal.SIGKILL)
        self.probe(fault, "restarted", lambda: self.stack.worker.replaced(pid))

        def healed() -> bool:  # the killed job's batch is written, the queue back to its usual length
            r = self.stack.redis_client()
            return not any(r.exists(k) for k in orphans) and r.llen(keys.SETTLE_PENDING) < 300

        self.probe(fault, "healed", lambda: self.stack.worker.pid != pid and healed())
        return f"pid {pid}, holding {held} settlements in {len(orphans)} batch(es)"

    def db_outage(self, fault: dict) -> str:
        os.kill(self.stack.proxy.pid, signal.SIGUSR1)

        def restore():
            time.sleep(DB_OUTAGE_S)
            os.kill(self.stack.proxy.pid, signal.SIGUSR2)
            self.mark(fault, "restored")
            self.mark(fault, "healed", lambda: requests.get(self.stack.web.url + "/readyz", timeout=5).ok)

        self.later(restore)
        return f"every connection cut, new ones refused for {DB_OUTAGE_S} s"

    def writer_kill(self, fault: dict) -> str:
        """moved: HAProxy sends to a backup; healed: a lead settled and a payment credited since
        (through the new writer: the old one is dead); rejoined: the killed node started again,
        Synced, the cluster 3 nodes again (HAProxy then sends to it again, closing the backup's
        sessions: a second move)."""
        galera = self.stack.galera
        dead = galera.writer()
        galera.kill(dead)

        def latest_after(moved):
            row = soak_checks.query(self.stack.db_url, LATEST_WRITES)
            return all(t is not None and t > moved for t in row)

        def heal():
            if self.mark(fault, "moved", lambda: galera.writer() not in (None, dead)):
                moved = datetime.now(timezone.utc).replace(tzinfo=None)  # as the ledger's DATETIME(6)
                self.mark(fault, "healed", lambda: latest_after(moved))
            self.mark(fault, "rejoined", lambda: galera.start_node(dead) or galera.synced(dead, size=3))

        self.later(heal)
        return f"{dead}, the node HAProxy writes to"

    def scheduler_kill(self, fault: dict) -> str:
        pid, jobs = self.stack.scheduler.pid, periodic_jobs(self.stack)  # 6 today, 2 when the soak was written
        os.kill(pid, signal.SIGKILL)
        self.probe(fault, "healed", lambda: self.stack.scheduler.replaced(pid) and periodic_jobs(self.stack) >= jobs)
        return f"pid {pid}, {jobs} periodic jobs"

    def redis_restart(self, fault: dict) -> str:
        self.stack.redis.restart_empty()
        ready = [keys.ready(b) for b in self.stack.buyer_rules]
        self.probe(fault, "healed", lambda: all(self.stack.redis_client().exists(k) for k in ready))
        return "kill -9, started again without data"


# the last settlement and the last credit (the newest rows: the ledger's ids only grow)
LATEST_WRITES = (
    "SELECT (SELECT MAX(settled_at) FROM (SELECT settled_at FROM leads ORDER BY id DESC LIMIT 50) l),"
    " (SELECT MAX(credited_at) FROM (SELECT credited_at FROM payments ORDER BY id DESC LIMIT 50) p)"
)


def seconds_until(predicate, timeout: float, interval: float = 0.25) -> float | None:
    """Seconds until `predicate()` holds (one that raises, a component still down: not yet);
    None past `timeout`."""
    started = time.time()
    while time.time() - started < timeout:
        try:
            if predicate():
                return round(time.time() - started, 1)
        except Exception:
            pass
        time.sleep(interval)
    return None


def periodic_jobs(stack: Stack) -> int:
    """How many of workers/schedule.py's periodic jobs rq-scheduler holds."""
    from rq_scheduler import Scheduler

    from workers.schedule import ID_PREFIX

    conn = redis.Redis(port=stack.redis.port, socket_timeout=2)
    return sum(job.id.startswith(ID_PREFIX) for job in Scheduler(queue_name="floodgate", connection=conn).get_jobs())


def schedule(minutes: float, kinds: tuple[str, ...], rounds: bool = True) -> list[tuple[float, str]]:
    """(seconds into the run, fault): one round of `kinds` per 10 minutes, from the first
    minute to two minutes before the end. Not `rounds`: as many faults as six per 10 minutes,
    of `kinds` only, in turn (`--faults`: e.g. only those that step memory up)."""
    total = minutes * 60
    n = len(kinds) * max(1, round(minutes / 10)) if rounds else max(len(kinds), round(minutes / 10 * 6))
    first = min(60.0, total * 0.15)
    last = max(first, total - min(120.0, total * 0.25))
    step = (last - first) / max(1, n - 1)
    return [(first + i * step, kinds[i % len(kinds)]) for i in range(n)]


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def wait_settled(stack: Stack, outcomes: Path, timeout: float) -> float | None:
    """Seconds until the ledger holds every lead that got an answer and the settlement lists
    are empty; None if that did not happen within `timeout`."""
    records = [json.loads(line) for line in outcomes.read_text().splitlines() if line.startswith('{"k":"L"')]
    answered = {r["id"] for r in records if r["final"] in ("sold", "unsold")}

    def settled() -> bool:
        r = stack.redis_client()
        if r.llen(keys.SETTLE_PENDING) or any(r.scan_iter(match=keys.settle_processing("*"))):
            return False
        sql = "SELECT COUNT(*) FROM leads WHERE publisher_id=%s"
        return soak_checks.query(stack.db_url, sql, (PUBLISHER,))[0] >= len(answered)

    return seconds_until(settled, timeout, interval=2)


def wait_outbox(stack: Stack, timeout: float) -> float | None:
    """Seconds until the outbox holds no event that is not delivered: every event fanned out and
    none of its dispatches pending (the running code's tables, read from its models, which its
    migrations made); None past `timeout`."""
    from webhooks.storage.records.models import Event, EventDispatch

    events, dispatches = Event._meta.table_name, EventDispatch._meta.table_name
    sql = f"SELECT (SELECT COUNT(*) FROM {events} WHERE NOT fanned_out) + (SELECT COUNT(*) FROM {dispatches} WHERE status = 'pending')"
    return seconds_until(lambda: soak_checks.query(stack.db_url, sql)[0] == 0, timeout, interval=2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--lead-rate", type=float, default=150)
    ap.add_argument("--payment-rate", type=float, default=60)
    ap.add_argument("--drain-seconds", type=float, default=240, help="after the last send, how long clients retry")
    ap.add_argument("--settle-timeout", type=float, default=900, help="how long the ledger may take to hold it all")
    ap.add_argument("--no-faults", action="store_true", help="the same traffic without faults (a baseline)")
    ap.add_argument("--galera", action="store_true", help="the ledger on a Galera cluster; adds writer_kill")
    ap.add_argument(
        "--faults",
        metavar="KIND,...",
        help=f"only these faults, in turn, as many as the six would be (of: {', '.join(FAULTS)})",
    )
    ap.add_argument("--keep-db", action="store_true", help="keep the run's database (its URL is printed)")
    ap.add_argument("--reanalyse", metavar="RUN_DIR", help="check a finished run again (its database was kept)")
    ap.add_argument(
        "--rejudge-rss",
        metavar="NAME",
        help="judge the memory of a finished run again (bench/out/NAME.json; its database is not needed)",
    )
    args = ap.parse_args()
    # SIGTERM (a caller's time budget spent) unwinds the ExitStack below: every process stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    if args.rejudge_rss:
        return 0 if soak_report.rejudge_rss(args.rejudge_rss) else 1
    if args.reanalyse:
        meta = json.loads((OUT / args.reanalyse / "meta.json").read_text())
        result = soak_checks.analyse(OUT / args.reanalyse, meta, meta.pop("db_url"))
        return report(result, meta["name"])
    known = tuple(k for k in FAULTS if args.galera or k != "writer_kill")
    kinds = tuple(args.faults.split(",")) if args.faults else known
    if set(kinds) - set(known):
        ap.error(f"--faults: unknown {sorted(set(kinds) - set(known))}; known: {', '.join(known)}")
    name = f"soak-{args.minutes:g}m" + ("-nofaults" if args.no_faults else "-" + "+".join(kinds) if args.faults else "")
    name += "-galera" if args.galera else ""
    run_dir = OUT / f"{name}-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    with ExitStack() as es:
        log(f"starting the stack (logs in {run_dir})")
        try:
            stack = Stack(es, run_dir, args.minutes, args.lead_rate, galera=args.galera)
        except (SystemExit, subprocess.CalledProcessError, AssertionError, RuntimeError) as exc:
            log(f"the stack could not be set up: {exc}")
            return 2
        if args.keep_db:
            stack.keep_db = True
            log(f"the database is kept: {stack.db_url}")
        refunds, outbox = stack.has_refunds(), stack.has_outbox()
        log(f"refunds in the running code: {refunds}; payment-events outbox: {outbox}")
        traffic_cfg = {
            "url": stack.web.url,
            "api_key": API_KEY,
            "lead_rate": args.lead_rate,
            "payment_rate": args.payment_rate,
            "seconds": args.minutes * 60,
            "drain_s": args.drain_seconds,
            "out_dir": str(run_dir),
            "tag": "s" + str(int(time.time())),
            "refunds": refunds,
            "seed": 17,
        }
        (run_dir / "traffic.json").write_text(json.dumps(traffic_cfg))
        traffic = Proc(
            [venv_bin("python"), "-m", "soak.traffic", str(run_dir / "traffic.json")],
            stack.env,
            run_dir / "traffic.log",
        )
        es.callback(traffic.stop)
        t0 = time.time() + 0.5  # the traffic's own start (soak/traffic.py)
        sampler = Sampler(stack, t0, {"traffic": traffic.pid})
        faults = Faults(stack, t0)
        plan = [] if args.no_faults else schedule(args.minutes, kinds, rounds=not args.faults)
        last_note = time.time()
        while traffic.alive():
            now = time.time() - t0
            if plan and now >= plan[0][0]:
                faults.inject(plan.pop(0)[1])
            if time.time() - last_note >= 60:
                last_note = time.time()
                s = sampler.samples[-1] if sampler.samples else {}
                log(
                    f"{now / 60:.1f} min: {count_lines(run_dir / 'outcomes.jsonl')} answers, "
                    f"pending settlements {s.get('pending')}, redis {s.get('redis_used_mb')} MB, "
                    f"process exits {sum(e['event'] == 'exit' for e in stack.events)}"
                )
            time.sleep(0.2)
        summary_line = (run_dir / "traffic.log").read_text().strip().splitlines()
        log(f"traffic done: {summary_line[-1] if summary_line else 'no summary'}")
        log("waiting for the ledger to settle every answer")
        settled_after = wait_settled(stack, run_dir / "outcomes.jsonl", args.settle_timeout)
        log(f"settled after {settled_after} s")
        outbox_after = wait_outbox(stack, args.settle_timeout) if outbox else None
        if outbox:
            log(f"every payment event delivered after {outbox_after} s")
        # the buyers' log (the receiver's deliveries among them) is flushed once a second: stopped
        # now (SIGTERM flushes it), the analysis below reads all of it
        stack.buyers.stop()
        for t in faults.threads:
            t.join(timeout=1)
        samples = sampler.stop()
        versions = {"redis": redis_version(stack.redis_client())}
        versions["database"] = soak_checks.query(stack.db_url, "SELECT VERSION()")[0]
        if args.galera:
            versions["database"] += ", 3 Galera nodes behind HAProxy"
        meta = {
            "name": name,
            "t0": t0,
            "minutes": args.minutes,
            "commit": os.environ.get("FG_SOAK_COMMIT", "working tree"),
            "lead_rate": args.lead_rate,
            "payment_rate": args.payment_rate,
            "refunds": refunds,
            "outbox": outbox,
            "faults": faults.log,
            "no_faults": args.no_faults,
            "galera": args.galera,
            "samples": samples,
            "process_events": [{**e, "t": round(e.pop("at") - t0, 2)} for e in stack.events],
            "settled_after_s": settled_after,
            "outbox_delivered_after_s": outbox_after,
            "periodic_jobs_at_end": periodic_jobs(stack),
            "buyers": stack.buyer_rules,
            "publisher": PUBLISHER,
            "buyer_timeout_ms": BUYER_TIMEOUT_MS,
            "rq_failed_jobs": rq_failed(stack),
            "machine": machine_info(**versions),
            "traffic": json.loads(summary_line[-1]) if summary_line and summary_line[-1].startswith("{") else {},
        }
        (run_dir / "meta.json").write_text(json.dumps({**meta, "db_url": stack.db_url}, default=str))
        try:  # the database is dropped with the stack: analyse it first
            result = soak_checks.analyse(run_dir, meta, stack.db_url)
        except Exception:
            stack.keep_db = True
            log(f"the analysis failed; database kept: soak/run.py --reanalyse {run_dir.name} when fixed")
            raise
    return report(result, name)


def report(result: dict, name: str) -> int:
    ok = soak_report.write(result, name)
    for check in result["checks"]:
        log(f"{'ok  ' if check['ok'] else 'FAIL'} {check['name']}: {check['figures']}")
    log("all invariants hold" if ok else "an invariant does NOT hold (FAIL above)")
    return 0 if ok else 1


def rq_failed(stack: Stack) -> int:
    from rq import Queue
    from rq.registry import FailedJobRegistry

    conn = redis.Redis(port=stack.redis.port)
    return FailedJobRegistry(queue=Queue("floodgate", connection=conn)).count


if __name__ == "__main__":
    sys.exit(main())
