"""End-to-end lead path benchmark: Floodgate under gunicorn+gevent against a buyer answering in
~20 ms, at stepped concurrency, beside a bare Flask endpoint on the same gunicorn settings
measured in the same run (the ceiling); then a constant open-loop rate, watching the
settlement queue. Load comes from separate processes (wrk; bench/openloop.py).

    python bench/e2e.py [--seconds 10] [--concurrency 10,50,200,500] [--rate 400]
Writes bench/out/e2e.json, e2e.md and e2e.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent

from bench import stack
from bench.common import (
    OUT,
    QUICK,
    machine_info,
    markdown_table,
    mysql_version,
    redis_version,
    write_json,
    write_md,
)
from testkit.servers import (
    Proc,
    free_port,
    listening,
    venv_bin,
    wait_until,
)
from webhooks.storage import keys

API_KEY = "pk_bench_0123456789abcdef"
ADMIN = stack.ADMIN
BIG = 10**9


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def network(buyer_url: str) -> list[tuple[str, dict]]:
    """The admin PUTs (path, body) of the benches' network: the publisher Bench (API_KEY) and
    the buyer Acme at `buyer_url`, its caps out of reach."""
    caps = {"hourly": BIG, "daily": BIG, "weekly": BIG, "monthly": BIG, "daily_budget": "999999999.00"}
    return [
        ("/v1/admin/publishers/bench", {"name": "Bench", "api_key": API_KEY, "commission_pct": "10"}),
        (
            "/v1/admin/buyers/acme",
            {"name": "Acme", "endpoint_url": buyer_url, "price": "12.50", "caps": caps, "timezone": "America/Chicago"},
        ),
    ]


class Stack:
    """Every process of the run: Redis, MariaDB database, buyer, Floodgate, worker, bare app."""

    def __init__(self, es: ExitStack, tmp: Path, extra_env: dict | None = None, code: Path = ROOT):
        self.base = stack.base(es, tmp, extra_env, code=code)
        self.redis, self.db_url, env = self.base.redis, self.base.db_url, self.base.env
        self.buyer, buyer_url = self.base.buyer_stub(es)
        self.web = self.base.web(es, workers=2)
        self.worker = self.base.worker(es)
        self.bare_port = free_port()
        self.bare = Proc(
            [venv_bin("gunicorn"), "-c", "gunicorn.conf.py", "bench.bare_app:app"],
            {**env, "PORT": str(self.bare_port), "WEB_CONCURRENCY": "2"},
            tmp / "bare.log",
        )
        es.callback(self.bare.stop)
        self.bare_url = f"http://127.0.0.1:{self.bare_port}"
        self._configure(buyer_url)

    def _configure(self, buyer_url: str) -> None:
        h = {"Authorization": f"Bearer {ADMIN}"}
        for path, body in network(buyer_url):
            requests.put(f"{self.web.url}{path}", headers=h, timeout=10, json=body).raise_for_status()
        time.sleep(1.2)  # every web process has the config

        def lead(url: str) -> requests.Response:
            return requests.post(
                url + "/v1/leads", json={"state": "TX"}, timeout=10, headers={"Authorization": f"Bearer {API_KEY}"}
            )

        wait_until(lambda: listening(self.bare_port), timeout=60, what="bare app")  # a loaded machine: seconds
        wait_until(lambda: lead(self.bare_url).status_code == 200, timeout=30, what="bare app")
        answer = lead(self.web.url).json()
        if answer.get("status") != "sold":
            raise SystemExit(f"the stack does not sell: {answer}")

    def pids(self) -> dict[str, list[int]]:
        """Processes whose CPU time a run is charged with."""
        return {
            "web (2 gunicorn workers)": tree(self.web.pid),
            "rq worker": tree(self.worker.pid),
            "redis-server": [self.redis.proc.pid],
            "buyer stub": [self.buyer.pid],
            "mariadbd": mariadbd(),
        }


def tree(pid: int) -> list[int]:
    """`pid` and its children (gunicorn's master, then its workers)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [pid] + [int(p) for p in out.split()]


def mariadbd() -> list[int]:
    return [int(p) for p in subprocess.run(["pgrep", "-x", "mariadbd"], capture_output=True, text=True).stdout.split()]


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
        except (OSError, IndexError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


class QueueWatch:
    """Samples the length of the settlement queue while a run goes on."""

    def __init__(self, client):
        self.client, self.samples, self._stop = client, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((round(time.monotonic() - self._t0, 2), self.client.llen(keys.SETTLE_PENDING)))
            self._stop.wait(0.25)

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def warm(url: str, connections: int, tag: str) -> None:
    """A 2 s wrk run before measuring; none in a quick run (bench/common.py QUICK)."""
    if not QUICK:
        wrk(url, connections, 2, tag)


def wrk(url: str, connections: int, seconds: int, tag: str) -> dict:
    threads = min(2, connections)
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--timeout",
            "5s",
            "-s",
            str(ROOT / "bench" / "lead.lua"),
            url,
            "--",
            tag,
            API_KEY,
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    ).stdout
    data = json.loads(next(line for line in out.splitlines() if line.startswith("JSON "))[5:])
    errors = sum(data["errors"].values())
    return {
        "rps": round(data["requests"] / (data["duration_us"] / 1e6), 1),
        "requests": data["requests"],
        "errors": errors,
        "p50_ms": data["p50_us"] / 1000,
        "p95_ms": data["p95_us"] / 1000,
        "p99_ms": data["p99_us"] / 1000,
    }


def measure_fg(stack: Stack, run, label: str) -> tuple[dict, dict]:
    """Run `run()` against Floodgate, charging CPU per process and watching the queue."""
    pids = stack.pids()
    before = {name: cpu_seconds(p) for name, p in pids.items()}
    watch = QueueWatch(stack.redis.client())
    result = run()
    samples = watch.stop()
    n = result.get("requests") or result.get("completed") or 1
    cpu = {name: round((cpu_seconds(p) - before[name]) / n * 1000, 3) for name, p in pids.items()}
    drained_at = time.monotonic()
    wait_until(lambda: stack.redis.client().llen(keys.SETTLE_PENDING) == 0, timeout=120, what="drain")
    queue = {
        "max_pending": max((s[1] for s in samples), default=0),
        "last_pending": samples[-1][1] if samples else 0,
        "drain_after_s": round(time.monotonic() - drained_at, 2),
        "samples": samples,
    }
    log(f"{label}: {json.dumps({k: v for k, v in result.items() if k != 'statuses'})} queue max {queue['max_pending']}")
    return result, {"cpu_ms_per_lead": cpu, "queue": queue}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--concurrency", default="10,50,200,500")
    ap.add_argument("--rate", type=float, default=400)
    ap.add_argument("--rate-seconds", type=float, default=20)
    args = ap.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is needed (Debian: apt-get install wrk); scripts/bench installs it")
    steps = []
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="fg-e2e-")))
        log("starting redis, database, buyer stub, Floodgate, worker and the bare app")
        stack = Stack(es, tmp)
        for c in (int(x) for x in args.concurrency.split(",")):
            warm(stack.bare_url, c, f"warm{c}")  # warm both before measuring
            warm(stack.web.url, c, f"warm{c}")
            bare = wrk(stack.bare_url, c, args.seconds, f"bare{c}")
            log(f"bare c={c}: {bare}")
            fg, extra = measure_fg(stack, lambda c=c: wrk(stack.web.url, c, args.seconds, f"fg{c}"), f"floodgate c={c}")
            steps.append(
                {"connections": c, "floodgate": fg, "bare": bare, "ratio": round(fg["rps"] / bare["rps"], 3), **extra}
            )
        openloop, extra = measure_fg(
            stack,
            lambda: json.loads(
                subprocess.run(
                    [
                        venv_bin("python"),
                        "-m",
                        "bench.openloop",
                        stack.web.url,
                        API_KEY,
                        str(args.rate),
                        str(args.rate_seconds),
                    ],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=args.rate_seconds + 120,
                ).stdout
            ),
            f"open loop {args.rate}/s",
        )
        versions = {"redis": redis_version(stack.redis.client())}
        if stack.db_url.startswith("mysql://"):
            import pymysql

            conn = pymysql.connect(host="127.0.0.1", user="root")
            versions["database"] = mysql_version(conn)
            conn.close()
    data = {
        "machine": machine_info(**versions),
        "seconds": args.seconds,
        "buyer_delay_ms": 20,
        "steps": steps,
        "openloop": {**openloop, **extra},
    }
    write_json("e2e.json", data)
    write_md("e2e.md", render(data))
    plot(data, OUT / "e2e.png")
    log(f"wrote {OUT / 'e2e.md'}")
    return 0


def render(d: dict) -> str:
    rows = [
        {
            "c": s["connections"],
            "fg": s["floodgate"]["rps"],
            "bare": s["bare"]["rps"],
            "ratio": s["ratio"],
            "p50": s["floodgate"]["p50_ms"],
            "p95": s["floodgate"]["p95_ms"],
            "p99": s["floodgate"]["p99_ms"],
            "err": s["floodgate"]["errors"],
            "q": s["queue"]["max_pending"],
            "cpu": round(sum(s["cpu_ms_per_lead"].values()), 2),
        }
        for s in d["steps"]
    ]
    table = markdown_table(
        rows,
        (
            ("connections", "c"),
            ("Floodgate leads/s", "fg"),
            ("bare Flask req/s", "bare"),
            ("ratio", "ratio"),
            ("p50 ms", "p50"),
            ("p95 ms", "p95"),
            ("p99 ms", "p99"),
            ("errors", "err"),
            ("max queued settlements", "q"),
            ("CPU ms per lead, all processes", "cpu"),
        ),
    )
    heavy = max(d["steps"], key=lambda s: s["connections"])
    cpu_rows = [{"process": k, "ms": v} for k, v in heavy["cpu_ms_per_lead"].items()]
    ol = d["openloop"]
    best = max(d["steps"], key=lambda s: s["ratio"])
    return "\n".join(
        [
            f"Buyer stub answering after {d['buyer_delay_ms']} ms; {d['seconds']} s per step; wrk, 2 threads.",
            "",
            table,
            "",
            f"Best ratio to the bare Flask ceiling: **{best['ratio']}** at {best['connections']} connections.",
            "",
            f"CPU per lead by process at {heavy['connections']} connections (ms):",
            "",
            markdown_table(cpu_rows, (("process", "process"), ("CPU ms per lead", "ms"))),
            "",
            f"Open loop at {ol['offered_rate']:.0f} leads/s for {ol['seconds']:.0f} s (latency from the moment each "
            f"request was due): achieved {ol['achieved_rate']} leads/s, p50 {ol['p50_ms']} ms, p95 {ol['p95_ms']} ms, "
            f"p99 **{ol['p99_ms']} ms**; outcomes {ol['statuses']}. Settlement queue: at most "
            f"{ol['queue']['max_pending']} pending, {ol['queue']['last_pending']} at the end, empty "
            f"{ol['queue']['drain_after_s']} s later.",
        ]
    )


def plot(d: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = [s["connections"] for s in d["steps"]]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.8))
    a.plot(cs, [s["bare"]["rps"] for s in d["steps"]], "o-", label="bare Flask (ceiling)")
    a.plot(cs, [s["floodgate"]["rps"] for s in d["steps"]], "o-", label="Floodgate lead path")
    for s in d["steps"]:
        a.annotate(
            f"{s['ratio']:.2f}",
            (s["connections"], s["floodgate"]["rps"]),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
        )
    a.set(xscale="log", xlabel="concurrent connections", ylabel="requests/s", title="Throughput (ratio annotated)")
    a.legend()
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        b.plot(cs, [s["floodgate"][key] for s in d["steps"]], "o-", label=key.replace("_ms", ""))
    b.set(
        xscale="log",
        yscale="log",
        xlabel="concurrent connections",
        ylabel="ms",
        title="Floodgate publisher-side latency",
    )
    b.legend()
    ol = d["openloop"]
    t, q = zip(*ol["queue"]["samples"]) if ol["queue"]["samples"] else ((0,), (0,))
    c.plot(t, q)
    c.set(
        xlabel="seconds",
        ylabel="pending settlements",
        title=f"Open loop {ol['offered_rate']:.0f}/s: p99 {ol['p99_ms']} ms, queue",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
