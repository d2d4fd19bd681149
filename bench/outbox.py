"""The payment events outbox: how late events reach the application, and what the outbox adds
to a credit. Writes bench/out/outbox.{json,md,png}.

1. Lag: payments at a steady rate (default 300/s, paced threads: open loop) into the app under
   gunicorn+gevent with PAYMENT_EVENTS_URL pointing at a local receiver (a real HTTP server in a
   process of its own, verifying each event with the standardwebhooks library); one RQ worker
   (SimpleWorker, as the Procfile runs it) delivers. Lag of an event = its first arrival at the
   receiver minus its row's created_at, taken inside the credit's transaction just before the
   commit. Each rate runs on a fresh stack.
2. Cost: ledger.credit() in this process against the same MariaDB, without and with the outbox
   (announce: the balance read and the event row), in interleaved rounds, from 1 and from 16
   threads: p50/p99 of the whole credit transaction.

    python -m bench.outbox [--rate 300 [--rate 100 ...]] [--seconds 20] [--credits 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import timezone
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench import stack
from bench.common import (
    OUT,
    machine_info,
    markdown_table,
    paced_threads,
    percentiles,
    redis_version,
    write_json,
    write_md,
)
from testkit.config import SECRETS
from testkit.events import EVENTS_SECRET
from testkit.payments import PROVIDERS, deliver, encode, payload, signed_headers
from testkit.servers import (
    Proc,
    WebServer,
    free_port,
    listening,
    venv_bin,
    wait_until,
)
from webhooks.events import outbox
from webhooks.payments import ledger, notifications
from webhooks.storage.db import db, init_db
from webhooks.storage.models import Event, EventAttempt, EventDispatch, EventEndpoint

COST_THREADS = (1, 16)
RECORD = outbox.emit


def receive(port: int, path: str) -> None:
    """The application, in a process of its own (a receiver inside the load generator would
    queue behind its threads for the GIL): verify each event, answer 204, append
    `<webhook-id> <arrival time> <verified>` to `path`."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    hook, out = Webhook(EVENTS_SECRET), open(path, "a", buffering=1)  # noqa: SIM115  (for the process's life)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            at = time.time()
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                hook.verify(raw, dict(self.headers.items()))
                verified = 1
            except WebhookVerificationError:
                verified = 0
            self.send_response(204 if verified else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            out.write(f"{self.headers.get('webhook-id')} {at} {verified}\n")

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


def arrivals(path: Path) -> tuple[dict[str, float], int]:
    """First verified arrival of each event id, and how many arrivals failed verification."""
    first, unverified = {}, 0
    for line in path.read_text().splitlines() if path.exists() else []:
        event_id, at, verified = line.split()
        if verified == "1":
            first.setdefault(event_id, float(at))
        else:
            unverified += 1
    return first, unverified


def lag_run(env: dict, work: Path, rate: int, seconds: int, redis_url: str) -> dict:
    """Open-loop payments at `rate`/s for `seconds`; each event's commit-to-receiver lag."""
    port, log = free_port(), work / f"arrivals-{rate}.txt"
    receiver = Proc(
        [sys.executable, "-m", "bench.outbox", "--receive", str(port), str(log)], env, work / "receiver.log"
    )
    wait_until(lambda: listening(port), what="the receiver")
    env = {**env, "PAYMENT_EVENTS_URL": f"http://127.0.0.1:{port}/floodgate-events"}
    web = WebServer(env, work / "web.log", workers=2)
    worker = Proc(
        [
            venv_bin("rq"),
            "worker",
            "--url",
            redis_url,
            "--with-scheduler",
            "-w",
            "rq.worker.SimpleWorker",
            "floodgate",
            "floodgate-events",
        ],
        env,
        work / "worker.log",
    )
    try:
        rng = random.Random(11)
        n = rate * seconds
        bodies = []
        for i in range(n):
            provider = PROVIDERS[i % len(PROVIDERS)]
            raw = encode(
                payload(
                    provider,
                    f"lag{rate}-{i}",
                    rng.randint(100, 5_000_000),
                    "NGN",
                    f"payer{rng.randrange(500)}@example.com",
                )
            )
            bodies.append((provider, raw))
        local = threading.local()

        def one(i: int) -> str:
            if not hasattr(local, "session"):
                local.session = requests.Session()
            provider, raw = bodies[i]
            resp = deliver(web.url, provider, raw, session=local.session)
            return resp.json().get("status", str(resp.status_code)) if resp.status_code < 500 else "5xx"

        run = paced_threads(48, n, seconds, one, deadline_s=seconds * 3)
        credited = sum(r == "credited" for r in run.results)
        load_done = time.time()

        def delivered() -> bool:
            with db.connection_context():
                return EventDispatch.select().where(EventDispatch.status == "delivered").count() >= credited

        wait_until(delivered, timeout=600, interval=0.2, what="every event delivered")
        drained_s = time.time() - load_done
        first_arrival, unverified = arrivals(log)
        with db.connection_context():
            made = {
                e.event_id: e.created_at.replace(tzinfo=timezone.utc).timestamp()
                for e in Event.select(Event.event_id, Event.created_at)
            }
            for model in (EventAttempt, EventDispatch, Event, EventEndpoint):
                model.delete().execute()  # the next rate starts from an empty outbox
        lags = [(first_arrival[i] - made[i]) * 1000 for i in made if i in first_arrival]
        return {
            "rate_per_s": rate,
            "seconds": seconds,
            "payments": n,
            "credited": credited,
            "achieved_per_s": round(run.started / run.elapsed_s, 1) if run.elapsed_s else None,
            "late_start_ms": percentiles(run.late_ms),
            "events": len(made),
            "arrived": len(lags),
            "unverified_arrivals": unverified,
            "last_delivered_after_load_s": round(drained_s, 2),
            "lag_ms": {**percentiles(lags), "max": round(max(lags), 1) if lags else None},
            "_lags": lags,
        }
    finally:
        worker.stop()
        web.stop()
        receiver.stop()


def cost_run(n: int, rounds: int, threads: int, offset: int) -> dict[str, list[float]]:
    """ledger.credit() latencies (ms) without and with the outbox, `rounds` interleaved rounds."""
    samples: dict[str, list[float]] = {"without outbox": [], "with outbox": []}
    counter = iter(range(offset, offset + 10 * n * rounds))
    lock = threading.Lock()
    for _ in range(rounds):
        for variant, announce in (("without outbox", False), ("with outbox", True)):
            todo = iter(range(n // rounds))
            # the lever: the event row and its balance read, or neither (a bench-only switch)
            outbox.emit = RECORD if announce else (lambda _event, _now, deferred=False: None)  # type: ignore[assignment]

            def worker(variant=variant, todo=todo) -> None:
                mine = []
                with db.connection_context():
                    while True:
                        with lock:
                            if next(todo, None) is None:
                                break
                            i = next(counter)
                        raw = encode(
                            payload("standard", f"cost-{i}", 1_000 + i % 997, "NGN", f"cost{i % 200}@example.com")
                        )
                        event = notifications.parse("standard", raw)
                        d = ledger.receipt("standard", raw, signed_headers("standard", raw))
                        t = time.perf_counter()
                        assert ledger.credit(event, d) == "credited"
                        mine.append((time.perf_counter() - t) * 1000)
                with lock:
                    samples[variant].extend(mine)

            pool = [threading.Thread(target=worker) for _ in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
    outbox.emit = RECORD  # type: ignore[assignment]
    return samples


def plot(lags: dict[int, list[float]], cost: dict, path: Path) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    for rate, values in lags.items():
        ordered = sorted(values)
        a.plot([100 * i / len(ordered) for i in range(len(ordered))], ordered, label=f"{rate} payments/s offered")
    a.set_yscale("log")
    a.set_xlabel("percentile")
    a.set_ylabel("commit → receiver (ms)")
    a.set_title("event lag")
    a.legend()
    labels, p50, p99 = [], [], []
    for threads, variants in cost.items():
        for variant, s in variants.items():
            q = percentiles(s)
            labels.append(f"{variant}\n{threads} thread(s)")
            p50.append(q["p50"])
            p99.append(q["p99"])
    x = range(len(labels))
    b.bar([i - 0.2 for i in x], p50, 0.4, label="p50")
    b.bar([i + 0.2 for i in x], p99, 0.4, label="p99")
    b.set_xticks(list(x), labels, fontsize=8)
    b.set_ylabel("credit transaction (ms)")
    b.set_title("ledger.credit, MariaDB")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def render(machine: dict, lag: list[dict], rows: list[dict], extra: dict) -> str:
    lag_rows = [
        {
            "offered": r["rate_per_s"],
            "achieved": r["achieved_per_s"],
            "late": r["late_start_ms"]["p99"],
            "credited": f"{r['credited']:,}",
            "arrived": f"{r['arrived']:,}",
            "bad": r["unverified_arrivals"],
            **{k: r["lag_ms"][k] for k in ("p50", "p95", "p99", "max")},
            "drained": r["last_delivered_after_load_s"],
        }
        for r in lag
    ]
    return "\n".join(
        [
            f"### Event lag: commit → receiver ({lag[0]['seconds']} s of open-loop payments per rate)",
            "",
            markdown_table(
                lag_rows,
                (
                    ("offered /s", "offered"),
                    ("started /s", "achieved"),
                    ("p99 start late ms", "late"),
                    ("credited", "credited"),
                    ("events arrived", "arrived"),
                    ("failed verification", "bad"),
                    ("lag p50 ms", "p50"),
                    ("p95 ms", "p95"),
                    ("p99 ms", "p99"),
                    ("max ms", "max"),
                    ("last event after the load s", "drained"),
                ),
            ),
            "",
            "Every credited payment's event arrived and verified. The load generator, two gevent web "
            "workers, one RQ worker, the receiver and MariaDB share the machine's CPUs; when the web "
            "cannot start payments at the offered rate (started /s below it, starts late), the lag is "
            "measured at the rate it achieved.",
            "",
            "### What the outbox adds to a credit (`ledger.credit`, MariaDB, interleaved rounds)",
            "",
            markdown_table(
                rows,
                (
                    ("threads", "threads"),
                    ("variant", "variant"),
                    ("credits", "credits"),
                    ("p50 ms", "p50"),
                    ("p95 ms", "p95"),
                    ("p99 ms", "p99"),
                ),
            ),
            "",
            "With the outbox minus without, same run: "
            + "; ".join(f"{t} thread(s): p50 {d['p50']:+.2f} ms, p99 {d['p99']:+.2f} ms" for t, d in extra.items())
            + ". The outbox adds one indexed SELECT of the locked wallet row and one INSERT to the same "
            "transaction; after the commit the web process pays one pipelined Redis round trip to wake "
            "the worker (not in these figures).",
            "",
            f"Machine: {machine['nproc']} CPUs ({machine['cpu_model']}), load average "
            f"{machine['loadavg_1m_5m_15m']} when the run ended (other work on the machine, e.g. a soak, "
            "skews every figure here).",
            "",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receive", nargs=2, metavar=("PORT", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=int, action="append", help="payments per second (repeatable; default 300)")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--credits", type=int, default=3000, help="per variant and thread count")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.receive:
        receive(int(args.receive[0]), args.receive[1])
        return 0
    with ExitStack() as es, tempfile.TemporaryDirectory(prefix="fg-bench-outbox-") as tmp:
        work = Path(tmp)
        base = stack.base(es, work, {**SECRETS, "PAYMENT_EVENTS_SECRET": EVENTS_SECRET}, mysql_only=True)
        redis_server, env = base.redis, base.env
        init_db(base.db_url, pool_size=max(COST_THREADS) + 4)
        es.callback(db.close)
        lag, lags = [], {}
        for rate in args.rate or [300]:
            print(f"lag: {rate} payments/s for {args.seconds} s", flush=True)
            result = lag_run(env, work, rate, args.seconds, redis_server.url)
            lags[rate] = result.pop("_lags")
            lag.append(result)
        cost, offset = {}, 0
        for threads in COST_THREADS:
            print(f"cost: {args.credits} credits per variant from {threads} thread(s)", flush=True)
            cost[threads] = cost_run(args.credits, args.rounds, threads, offset)
            offset += 10 * args.credits * args.rounds
        with db.connection_context():
            mariadb = db.execute_sql("SELECT VERSION()").fetchone()[0]
        machine = machine_info(redis_version=redis_version(redis_server.client()), mariadb=mariadb)
    rows = []
    for threads, variants in cost.items():
        for variant, s in variants.items():
            rows.append({"threads": threads, "variant": variant, "credits": len(s), **percentiles(s)})
    extra = {
        t: {q: round(percentiles(v["with outbox"])[q] - percentiles(v["without outbox"])[q], 3) for q in ("p50", "p99")}
        for t, v in cost.items()
    }
    write_json("outbox.json", {"machine": machine, "lag": lag, "cost": rows, "outbox_adds_ms": extra})
    plot(lags, cost, OUT / "outbox.png")
    md = render(machine, lag, rows, extra)
    write_md("outbox.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
