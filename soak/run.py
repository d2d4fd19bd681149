"""Soak under faults: the whole Procfile stack for minutes to hours under mixed traffic while
processes die, then check that nothing was lost, doubled or over a cap (issue 17).

    scripts/soak [--minutes 10] [--lead-rate 150] [--payment-rate 60]

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
from pathlib import Path

import redis
import requests

from bench.common import machine_info, mysql_version, redis_version
from soak import checks as soak_checks
from soak import report as soak_report
from soak.report import OUT
from soak.stack import API_KEY, BUYER_TIMEOUT_MS, PUBLISHER, Sampler, Stack
from testkit.payments import child_pids
from testkit.servers import Proc, venv_bin
from webhooks.storage.live import keys

FAULTS = ("web_worker_kill", "buyer_hang", "rq_worker_kill", "db_outage", "scheduler_kill", "redis_restart")
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

    def probe(self, fault: dict, name: str, predicate, timeout: float = PROBE_TIMEOUT_S) -> None:
        """Record milestone `name` of `fault` when `predicate()` first holds (in a thread)."""

        def run():
            deadline = time.time() + timeout
            while time.time() < deadline:
                try:
                    if predicate():
                        fault["milestones"][name] = round(self.rel() - fault["t"], 2)
                        return
                except Exception:  # a probe of a component still down: look again
                    pass
                time.sleep(0.25)
            fault["milestones"][name] = None

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def web_worker_kill(self, fault: dict) -> str:
        before = child_pids(self.stack.web.pid)
        os.kill(before[0], signal.SIGKILL)
        self.probe(
            fault,
            "healed",
            lambda: (
                len(set(child_pids(self.stack.web.pid)) - set(before)) >= 1 and len(child_pids(self.stack.web.pid)) == 2
            ),
        )
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
        self.probe(fault, "restarted", lambda: self.stack.worker.pid != pid and self.stack.worker.proc.alive())
        # healed: the killed job's batch is written and the queue is back to its usual length
        self.probe(
            fault,
            "healed",
            lambda: (
                self.stack.worker.pid != pid
                and not any(self.stack.redis_client().exists(k) for k in orphans)
                and self.stack.redis_client().llen(keys.SETTLE_PENDING) < 300
            ),
        )
        return f"pid {pid}, holding {held} settlements in {len(orphans)} batch(es)"

    def db_outage(self, fault: dict) -> str:
        os.kill(self.stack.proxy.pid, signal.SIGUSR1)

        def restore():
            time.sleep(DB_OUTAGE_S)
            os.kill(self.stack.proxy.pid, signal.SIGUSR2)
            fault["milestones"]["restored"] = round(self.rel() - fault["t"], 2)
            self.probe(fault, "healed", lambda: requests.get(self.stack.web.url + "/readyz", timeout=5).ok)

        threading.Thread(target=restore, daemon=True).start()
        return f"every connection cut, new ones refused for {DB_OUTAGE_S} s"

    def scheduler_kill(self, fault: dict) -> str:
        pid = self.stack.scheduler.pid
        os.kill(pid, signal.SIGKILL)
        self.probe(
            fault,
            "healed",
            lambda: (
                self.stack.scheduler.pid != pid and self.stack.scheduler.proc.alive() and periodic_jobs(self.stack) == 2
            ),
        )
        return f"pid {pid}"

    def redis_restart(self, fault: dict) -> str:
        self.stack.redis.restart_empty()
        ready = [keys.ready(b) for b in self.stack.buyer_rules]
        self.probe(fault, "healed", lambda: all(self.stack.redis_client().exists(k) for k in ready))
        return "kill -9, started again without data"


def periodic_jobs(stack: Stack) -> int:
    """How many of workers/schedule.py's periodic jobs rq-scheduler holds."""
    from rq_scheduler import Scheduler

    from workers.schedule import ID_PREFIX

    conn = redis.Redis(port=stack.redis.port, socket_timeout=2)
    return sum(job.id.startswith(ID_PREFIX) for job in Scheduler(queue_name="floodgate", connection=conn).get_jobs())


def schedule(minutes: float, kinds: tuple[str, ...] = FAULTS) -> list[tuple[float, str]]:
    """(seconds into the run, fault): one round of the six per 10 minutes, from the first
    minute to two minutes before the end. With `kinds`, as many faults, of those kinds only,
    in turn (`--faults`: e.g. only those that step memory up, in long-lived processes)."""
    total = minutes * 60
    rounds = max(1, round(minutes / 10))
    n = len(FAULTS) * rounds if kinds == FAULTS else max(len(kinds), round(minutes / 10 * len(FAULTS)))
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
    import pymysql

    started = time.time()
    records = [json.loads(line) for line in outcomes.read_text().splitlines() if line.startswith('{"k":"L"')]
    answered = {r["id"] for r in records if r["final"] in ("sold", "unsold")}
    while time.time() - started < timeout:
        try:
            r = stack.redis_client()
            busy = r.llen(keys.SETTLE_PENDING) + sum(1 for _ in r.scan_iter(match=keys.settle_processing("*")))
            conn = soak_checks.connect(stack.db_url)
            with conn.cursor() as c:
                c.execute("SELECT COUNT(*) FROM leads WHERE publisher_id=%s", (PUBLISHER,))
                settled = c.fetchone()[0]
            conn.close()
            if busy == 0 and settled >= len(answered):
                return round(time.time() - started, 1)
        except (redis.RedisError, pymysql.MySQLError):
            pass
        time.sleep(2)
    return None


def wait_outbox(stack: Stack, timeout: float) -> float | None:
    """Seconds until the outbox holds no event that is not delivered: every event fanned out and
    none of its dispatches pending (the running code's tables, read from its models; before the
    events table, `payment_events`); None past `timeout`."""
    import pymysql

    from webhooks.storage.records.models import Event, EventDispatch

    events, dispatches = Event._meta.table_name, EventDispatch._meta.table_name
    started = time.time()
    while time.time() - started < timeout:
        try:
            conn = soak_checks.connect(stack.db_url)
            with conn.cursor() as c:
                c.execute("SHOW TABLES LIKE %s", (events,))
                if c.fetchone():
                    c.execute(
                        f"SELECT (SELECT COUNT(*) FROM {events} WHERE NOT fanned_out)"
                        f" + (SELECT COUNT(*) FROM {dispatches} WHERE status = 'pending')"
                    )
                else:
                    c.execute("SELECT COUNT(*) FROM payment_events WHERE status <> 'delivered'")
                left = c.fetchone()[0]
            conn.close()
            if left == 0:
                return round(time.time() - started, 1)
        except pymysql.MySQLError:
            pass
        time.sleep(2)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--lead-rate", type=float, default=150)
    ap.add_argument("--payment-rate", type=float, default=60)
    ap.add_argument("--drain-seconds", type=float, default=240, help="after the last send, how long clients retry")
    ap.add_argument("--settle-timeout", type=float, default=900, help="how long the ledger may take to hold it all")
    ap.add_argument("--no-faults", action="store_true", help="the same traffic without faults (a baseline)")
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
    kinds = tuple(args.faults.split(",")) if args.faults else FAULTS
    if set(kinds) - set(FAULTS):
        ap.error(f"--faults: unknown {sorted(set(kinds) - set(FAULTS))}; known: {', '.join(FAULTS)}")
    name = f"soak-{args.minutes:g}m" + ("-nofaults" if args.no_faults else "-" + "+".join(kinds) if args.faults else "")
    run_dir = OUT / f"{name}-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    with ExitStack() as es:
        log(f"starting the stack (logs in {run_dir})")
        try:
            stack = Stack(es, run_dir, args.minutes, args.lead_rate)
        except (SystemExit, subprocess.CalledProcessError, AssertionError) as exc:
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
        plan = [] if args.no_faults else schedule(args.minutes, kinds)
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
        conn = soak_checks.connect(stack.db_url)
        versions["database"] = mysql_version(conn)
        conn.close()
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
