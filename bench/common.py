"""Helpers shared by the benchmarks: percentiles, a description of the machine, a paced
multi-threaded runner, and writers for the reports under bench/out/ (git-ignored)."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

_ROOT = Path(__file__).resolve().parent.parent
# FG_BENCH_OUT: `scripts/bench --quick` writes elsewhere, leaving the fragments of REPORT.md alone.
OUT = Path(os.environ.get("FG_BENCH_OUT") or Path(__file__).resolve().parent / "out")
# FG_BENCH_QUICK=1 (`scripts/bench --quick`): the amounts a bench fixes itself (warm-ups, lists
# of payments, rounds, burst sizes) cut to a token, so that every bench runs through in seconds:
# that it still runs is all such a run shows; its figures mean nothing.
QUICK = os.environ.get("FG_BENCH_QUICK") == "1"


def head_rev() -> str:
    """The checkout's HEAD, short."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True, text=True)
    return out.stdout.strip()


@contextmanager
def worktrees(revs: dict[str, str], prefix: str) -> Iterator[dict[str, Path]]:
    """A detached git worktree of each revision ({arm: rev}), removed on the way out: an arm
    runs committed code, never files edited while the bench runs."""
    codes: dict[str, Path] = {}
    try:
        for name, rev in revs.items():
            codes[name] = Path(tempfile.mkdtemp(prefix=f"{prefix}-{name}-"))
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(codes[name]), rev],
                cwd=_ROOT,
                check=True,
                capture_output=True,
            )
        yield codes
    finally:
        for path in codes.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=_ROOT, check=False)


def quick(full: int, token: int) -> int:
    """`full`, or `token` in a quick run."""
    return token if QUICK else full


def percentiles(samples_ms: list[float], quantiles: tuple[int, ...] = (50, 95, 99)) -> dict[str, float | None]:
    """p50/p95/p99 (or the `quantiles` asked for) of `samples_ms` by nearest rank (an observed
    value, never interpolated); None for each when there are no samples."""
    ordered = sorted(samples_ms)

    def rank(q: int) -> float | None:
        if not ordered:
            return None
        return round(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)], 3)

    return {f"p{q}": rank(q) for q in quantiles}


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(**server_versions: str) -> dict[str, Any]:
    """What a reader needs to weigh the numbers: CPUs usable by this process (as `nproc`
    counts them), CPU model, OS, Python and the interpreter it runs on (two builds of one
    version ran some loops a quarter apart: bench/history part 37), the UTC date, the load
    average (other work on the machine skews timings), and any server versions passed in."""
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "interpreter": os.path.realpath(sys._base_executable),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "loadavg_1m_5m_15m": [round(x, 2) for x in os.getloadavg()],
        **server_versions,
    }


def mysql_kwargs(url: str) -> dict:
    """PyMySQL connect() keywords of a mysql://user:pass@host:port/db URL."""
    p = urlparse(url)
    return {
        "host": p.hostname,
        "port": p.port or 3306,
        "user": p.username or "root",
        "password": p.password or "",
        "database": p.path.lstrip("/"),
        "connect_timeout": 5,
    }


def redis_version(client) -> str:
    """The version a live redis-py client's server reports."""
    return str(client.info("server")["redis_version"])


def mysql_version(conn) -> str:
    """The version string a live PyMySQL connection's server reports (e.g. MariaDB's)."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        return str(cur.fetchone()[0])


def write_json(name: str, data: Any) -> Path:
    """Write `data` to bench/out/<name> as indented JSON; return the path."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def write_md(name: str, text: str) -> Path:
    """Write markdown `text` to bench/out/<name>; return the path."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


def markdown_table(rows: list[dict], columns: tuple[tuple[str, str], ...]) -> str:
    """`rows` as a markdown table; `columns` are (heading, row key) pairs, in order."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[k]) for _, k in columns) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class PacedRun:
    """What `paced_threads` observed."""

    results: list[Any]  # fn(i) for item i (the exception if it raised); None if never started
    late_ms: list[float]  # how long after its scheduled time each started item began
    elapsed_s: float  # from the first scheduled start to the last item's end
    stuck_threads: int  # threads still busy when the deadline (plus grace) had passed

    @property
    def started(self) -> int:
        return sum(r is not None for r in self.results)


def paced_threads(
    n_threads: int, n_items: int, duration_s: float, fn: Callable[[int], Any], *, deadline_s: float = 60.0
) -> PacedRun:
    """Run fn(0) .. fn(n_items - 1) from `n_threads` threads, item i due at
    start + i * duration_s / n_items (duration_s=0: all due at once, as fast as possible).

    Items are handed out in order from one shared cursor, so a thread held up by a slow call
    does not delay items that an idle thread could take; an item is never started early.
    No item starts after `deadline_s`; fn must return something other than None.
    """
    interval = duration_s / n_items if n_items else 0.0
    results: list[Any] = [None] * n_items
    late_ms = [0.0] * n_items
    ends: list[float] = []
    cursor = iter(range(n_items))
    lock = threading.Lock()
    go = threading.Barrier(n_threads + 1)
    t0 = 0.0

    def worker() -> None:
        go.wait()
        while True:
            with lock:
                i = next(cursor, None)
            if i is None or time.perf_counter() > t0 + deadline_s:
                return
            due = t0 + i * interval
            if (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            late_ms[i] = (time.perf_counter() - due) * 1000
            try:
                results[i] = fn(i)
            except Exception as exc:  # recorded, so one failing call cannot end a thread
                results[i] = exc
            ends.append(time.perf_counter())

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(n_threads)]
    for t in threads:
        t.start()
    t0 = time.perf_counter() + 0.05  # after every thread exists, so start-up is not measured
    go.wait()
    for t in threads:
        t.join(max(0.0, t0 + deadline_s + 5.0 - time.perf_counter()))
    started = [late_ms[i] for i, r in enumerate(results) if r is not None]
    return PacedRun(results, started, (max(ends) - t0) if ends else 0.0, sum(t.is_alive() for t in threads))
