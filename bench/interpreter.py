"""Two builds of one Python version side by side: the same pure-Python loops timed in each
interpreter, the interpreters taking turns, medians of the rounds. scripts/setup-venv prefers
the distribution's build (profile-guided and link-time optimised) to one built from source
without --enable-optimizations (pyenv's default); this shows what that choice is worth on
this machine, apart from the noise of a whole stack.

    python -m bench.interpreter [--rounds 21] [PYTHON ...]
        (default: /usr/bin/python3.11 and every pyenv 3.11 found; with fewer than two, it
        says so and stops)

The loops: recursive calls (fib 25), making objects and calling their methods (300,000), and
encoding and decoding a lead-sized JSON object (50,000 times: the json module's C
accelerator). Writes bench/out/interpreter.json and interpreter.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import machine_info, write_json, write_md

# Run by each interpreter as `python -c`: prints its version and {loop: ms} (the best of 3, as
# timeit advises).
LOOPS = r"""
import json, platform, time
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
class Item:
    def __init__(self, x):
        self.x = x
    def get(self):
        return self.x
def objects(n):
    s = 0
    for i in range(n):
        s += Item(i).get()
    return s
LEAD = {"lead_id": "x-2-320", "fields": {"email": "a@example.com", "zip": "94107", "state": "CA"}, "n": [1, 2, 3]}
def codec(n):
    for _ in range(n):
        json.loads(json.dumps(LEAD))
out = {}
for name, fn, arg in (("calls (fib 25)", fib, 25), ("objects (300,000)", objects, 300000), ("JSON (50,000)", codec, 50000)):
    best = None
    for _ in range(3):
        t = time.perf_counter()
        fn(arg)
        took = (time.perf_counter() - t) * 1000
        best = took if best is None else min(best, took)
    out[name] = round(best, 2)
print(json.dumps({"version": platform.python_version(), "ms": out}))
"""


def found() -> list[str]:
    """The distribution's 3.11 and pyenv's 3.11 builds on this machine."""
    candidates = [Path("/usr/bin/python3.11")]
    candidates += sorted(Path(os.path.expanduser("~/.pyenv/versions")).glob("3.11*/bin/python3.11"))
    return [str(p) for p in candidates if p.exists()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=21, help="this machine's speed swings by a third within seconds")
    ap.add_argument("pythons", nargs="*", help="interpreters to compare (default: those found)")
    args = ap.parse_args()
    if len(args.pythons) == 1:
        ap.error("name two interpreters or more, or none (those found)")
    pythons = args.pythons or found()
    if len(pythons) < 2:
        print(f"only {pythons} found on this machine: nothing to compare", file=sys.stderr)
        return 0
    runs: dict[str, list[dict]] = {p: [] for p in pythons}
    for r in range(args.rounds):
        for p in pythons if r % 2 == 0 else reversed(pythons):
            runs[p].append(
                json.loads(subprocess.run([p, "-c", LOOPS], capture_output=True, text=True, check=True).stdout)
            )
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    loops = list(runs[pythons[0]][0]["ms"])
    data = {
        "machine": machine_info(),
        "rounds": args.rounds,
        "interpreters": {
            p: {
                "version": runs[p][0]["version"],
                "ms": {k: statistics.median(x["ms"][k] for x in runs[p]) for k in loops},
            }
            for p in pythons
        },
    }
    write_json("interpreter.json", data)
    write_md("interpreter.md", render(data))
    print(render(data))
    return 0


def render(d: dict) -> str:
    pythons = list(d["interpreters"])
    first = d["interpreters"][pythons[0]]["ms"]
    head = " | ".join(f"{p} ({d['interpreters'][p]['version']})" for p in pythons)
    lines = [
        "### Two builds of Python 3.11",
        "",
        f"Machine: {', '.join(f'{k} {v}' for k, v in d['machine'].items())}.",
        "",
        f"ms per loop, the best of 3 in each run, medians of {d['rounds']} runs with the interpreters taking turns; "
        f"ratio: each against {pythons[0]}.",
        "",
        f"| loop | {head} | " + " | ".join(f"ratio {p}" for p in pythons[1:]) + " |",
        "|---|" + "---|" * (2 * len(pythons) - 1),
    ]
    for loop, base in first.items():
        ms = [d["interpreters"][p]["ms"][loop] for p in pythons]
        lines.append(
            f"| {loop} | "
            + " | ".join(str(m) for m in ms)
            + " | "
            + " | ".join(f"{m / base:.2f}" for m in ms[1:])
            + " |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
