"""Where a web worker's CPU goes under load: py-spy samples one of the two gunicorn workers of
bench/stack.py's Stack while wrk drives the payment path (2,000 payments × 5, shuffled) or the
lead path at 50 connections.

    python -m bench.profile [--path payments|leads|both] [--seconds 12] [--wall] [--arm plain]

`--arm plain` samples the plain seed's web worker instead (bench/plain_seed, started as
bench/versus.py starts it: the same gunicorn settings, its own Redis and database) under the
same load, so that the two arms' costs per request can be set side by side.

Samples are taken only while the worker holds the GIL (`py-spy --gil`): its CPU. Without it
(`--wall`) a worker preempted on a busy 2-core machine is sampled where the scheduler stopped
it, mostly in a loopback `send` that woke Redis or the database, which reads as a third of the
time in sends. Writes bench/out/profile.md (per path: the share of samples under each layer —
sends, Redis, the database, JSON, Flask, metrics, logging —, under each step of the path's own
code, and self time by function) and the raw collapsed stacks (profile-<path>.txt). py-spy
needs ptrace: run as root, or with kernel.yama.ptrace_scope=0.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import tempfile
import threading
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from bench import stack as stack_mod
from bench.common import OUT, machine_info, write_json, write_md
from bench.levers import PAYSTACK_FIRST
from bench.stack import Stack, first_deliveries, log, lua_list, tree, warm, wrk, wrk_payments
from bench.versus import start_plain
from testkit.config import SECRETS
from testkit.servers import venv_bin

# (name, substring of a frame): a sample counts for a layer when any of its frames has it
LAYERS = (
    ("socket sends", "send ("),
    ("socket receives", "recv"),
    ("Redis client (redis-py, hiredis)", "redis/"),
    ("database (peewee, PyMySQL)", "pymysql/"),
    ("JSON (strict parsing, encoding)", "json"),
    ("signature checks (hmac)", "hmac"),
    ("gunicorn: reading the request, writing the answer", "gunicorn/http/"),
    ("prometheus-client", "prometheus_client/"),
    ("logging", "logging/"),
    ("the event loop waiting for sockets (idle)", "poll.poll ("),
)
# A sample of another thread waiting on a lock (gevent's thread pool) is not the worker's work.
IDLE_THREAD = "acquire_with_timeout ("
# Per arm and path, the frame of its own entry point: the steps are the frames called from it.
ENTRY = {
    "floodgate": {"payments": "PaymentWebhooks.receive (", "leads": "Intake.take ("},
    "plain": {"payments": "paystack (bench/plain_seed/app.py", "leads": "post_lead (bench/plain_seed/app.py"},
}


def package(frame: str) -> str:
    """The package of a frame `func (path/to/file.py:line)`: the path's first part."""
    where = frame.rpartition(" (")[2]
    return where.split("/", 1)[0] if "/" in where else where.split(".py", 1)[0]


def summarize(raw: str) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, [(leaf function, samples)] top 20, [(layer, samples)], [(package, self samples)])."""
    total, leaves, layers, packages = 0, Counter(), Counter(), Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = stack.split(";")
        if IDLE_THREAD in frames[-1]:
            continue
        total += count
        leaves[frames[-1]] += count
        packages[package(frames[-1])] += count
        for name, marker in LAYERS:
            if any(marker in f for f in frames):
                layers[name] += count
    return total, leaves.most_common(20), [(name, layers[name]) for name, _ in LAYERS], packages.most_common(12)


def steps(raw: str, entry: str) -> list[tuple[str, int]]:
    """Samples by the function `entry` called (its steps), with what ran outside `entry` (the
    server, Flask, the request hooks) as one row."""
    total, by_step = 0, Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if IDLE_THREAD in stack:
            continue
        total += int(n)
        frames = stack.split(";")
        at = next((i for i, frame in enumerate(frames) if entry in frame), None)
        if at is None:
            by_step["outside the path (gunicorn, Flask, request hooks)"] += int(n)
        else:
            step = frames[at + 1].rpartition(" (")[0] if at + 1 < len(frames) else "(its own lines)"
            by_step[step] += int(n)
    return by_step.most_common(12)


def _floodgate(es: ExitStack, tmp: Path) -> tuple[str, int]:
    """bench/stack.py's Stack: Floodgate's URL and the pid of one of its two web workers."""
    stack = Stack(es, tmp, {**SECRETS, "WEB_CONCURRENCY": "2"})
    return stack.web.url, stack.pids()["web (2 gunicorn workers)"][1]  # [0] is gunicorn's master


def _plain(es: ExitStack, tmp: Path) -> tuple[str, int]:
    """The plain seed as bench/versus.py starts it, on a database of its own (its tables are not
    Floodgate's), beside the buyer stub and no process of Floodgate's: its URL and the pid of
    one of its two web workers."""
    base = stack_mod.base(es, tmp, {**SECRETS, "WEB_CONCURRENCY": "2"})
    _, buyer_url = base.buyer_stub(es)
    database = stack_mod.database(es, tmp, mysql_only=True)
    plain = start_plain(es, tmp, base.env, base.redis.url, database, buyer_url, "plain")
    return plain.url, tree(plain.proc.pid)[1]  # type: ignore[attr-defined]


def profile(path: str, seconds: int, gil: bool, arm: str = "floodgate") -> list[str]:
    """Run one path of `arm` under wrk while py-spy samples a web worker; its markdown lines."""
    raw_path = OUT / f"profile-{path}{'' if arm == 'floodgate' else '-' + arm}.txt"
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="fg-profile-")))
        url, worker = (_plain if arm == "plain" else _floodgate)(es, tmp)
        if path == "payments":  # the first-delivery mix: most requests a durable credit
            deliveries = first_deliveries("profile", PAYSTACK_FIRST, random.Random(16))
            listing = tmp / "deliveries.lua"
            lua_list(deliveries, listing)
            run = lambda: wrk_payments(url, listing, 50, seconds + 3)  # noqa: E731
        else:
            warm(url, 50, "warm")
            run = lambda: wrk(url, 50, seconds + 3, "profile")  # noqa: E731
        result: dict = {}
        load = threading.Thread(target=lambda: result.update(run()))
        load.start()
        subprocess.run(
            [
                venv_bin("py-spy"),
                "record",
                "-r",
                "200",
                "-f",
                "raw",
                *(["--gil"] if gil else []),
                "-d",
                str(seconds),
                "-p",
                str(worker),
                "-o",
                str(raw_path),
            ],
            check=True,
            capture_output=True,
            timeout=seconds + 60,
        )
        load.join()
    raw = raw_path.read_text()
    total, leaves, layers, packages = summarize(raw)
    log(f"{arm} {path}: {total} samples, {result.get('rps')} requests/s")
    sampled = "while it held the GIL (its CPU)" if gil else "whenever it was not idle (wall time)"
    lines = [
        f"### The {path} path{'' if arm == 'floodgate' else ' of the plain seed'}"
        + (" (first deliveries: 6,000 Paystack payments × 5, shuffled)" if path == "payments" else ""),
        "",
        f"`py-spy record -r 200 -f raw{' --gil' if gil else ''}` of one of the two gunicorn workers for "
        f"{seconds} s under wrk at 50 connections ({result.get('rps')} requests/s over the whole run): "
        f"{total} samples of the worker's main thread, taken {sampled} (a thread-pool thread waiting on "
        "its lock is left out).",
        "",
        "| layer (a sample counts when any frame of its stack is in it) | share |",
        "|---|---|",
    ]
    lines += [f"| {name} | {n / total:.1%} |" for name, n in layers]
    entry = ENTRY[arm][path]
    lines += ["", f"| step (called by `{entry.split(' (')[0]}`) | share |", "|---|---|"]
    lines += [f"| `{name}` | {n / total:.1%} |" for name, n in steps(raw, entry)]
    lines += ["", "| package where the sample was taken (self time) | share |", "|---|---|"]
    lines += [f"| {name} | {n / total:.1%} |" for name, n in packages]
    lines += ["", "| function where the sample was taken (self time) | share |", "|---|---|"]
    lines += [f"| `{leaf}` | {n / total:.1%} |" for leaf, n in leaves]
    return lines + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", choices=("payments", "leads", "both"), default="both")
    ap.add_argument("--seconds", type=int, default=12)
    ap.add_argument("--wall", action="store_true", help="sample a worker whenever it is not idle, not its CPU")
    ap.add_argument("--arm", choices=("floodgate", "plain"), default="floodgate", help="whose web worker to sample")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    lines = [f"Machine: {', '.join(f'{k} {v}' for k, v in machine.items())}.", ""]
    for path in ("payments", "leads") if args.path == "both" else (args.path,):
        lines += profile(path, args.seconds, gil=not args.wall, arm=args.arm)
    write_json("profile.json", {"machine": machine})
    name = "profile.md" if args.arm == "floodgate" else f"profile-{args.arm}.md"
    write_md(name, "\n".join(lines))
    log(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
