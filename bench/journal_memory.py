"""The memory one web worker reaches under 2,000 large unsold leads (emoji-heavy, random, so
that nothing compresses them away): each lead's settlement stays in the worker's journal
for JOURNAL_KEEP_S (10 minutes), so before the journal had a byte budget a publisher
sending such leads grew every worker by their size (and three times that, escaped as JSON).

    python -m bench.journal_memory [--leads 2000] [--code DIR]

`--code DIR` runs the web process from another checkout (e.g. a `git worktree` of an older
commit) with this checkout's venv, so that before and after are measured by one script.
Writes bench/out/journal_memory-<label>.json; prints one line per 250 leads.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent

from bench import stack
from bench.common import machine_info, write_json
from testkit.servers import Proc, free_port, venv_bin, wait_until

ADMIN = stack.ADMIN
API_KEY = "pk_bench_journal_0123456789"


def lead_body(i: int) -> bytes:
    """About 200 KB of random emoji and hex: a lead no buyer takes."""
    rng = random.Random(i)
    note = "".join(chr(0x1F600 + rng.randrange(80)) for _ in range(30_000)) + rng.randbytes(40_000).hex()
    return json.dumps({"lead_id": f"mem-{i}", "state": "TX", "note": note}, ensure_ascii=False).encode()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def worker_pid(master: int) -> int:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    return int(out[0])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--leads", type=int, default=2000)
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout the web process runs")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    label = args.label or ("this-checkout" if args.code == ROOT else args.code.name)
    with ExitStack() as es, tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        port = free_port()
        base = stack.base(es, tmp, {"PORT": str(port), "WEB_CONCURRENCY": "1"}, code=args.code)
        env, redis = base.env, base.redis
        web = Proc([venv_bin("gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"], env, tmp / "web.log", cwd=args.code)
        es.callback(web.stop)
        worker = Proc(
            [
                venv_bin("rq"),
                "worker",
                "--url",
                redis.url,
                "-w",
                "rq.worker.SimpleWorker",
                "-q",
                "floodgate",
                "floodgate-events",
            ],
            env,
            tmp / "worker.log",
            cwd=args.code,
        )
        es.callback(worker.stop)
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return requests.get(url + "/healthz", timeout=2).ok
            except requests.ConnectionError:
                return False

        wait_until(up, timeout=60, what="gunicorn")
        requests.put(
            f"{url}/v1/admin/publishers/mem",
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=10,
            json={"name": "Mem", "api_key": API_KEY},
        ).raise_for_status()
        time.sleep(1.2)
        pid = worker_pid(web.pid)
        session = requests.Session()
        start_kb, samples = rss_kb(pid), []

        def send(i: int) -> int:
            return session.post(
                url + "/v1/leads",
                data=lead_body(i),
                timeout=60,
                headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
            ).status_code

        with ThreadPoolExecutor(8) as pool:
            for chunk in range(0, args.leads, 250):
                codes = list(pool.map(send, range(chunk, min(args.leads, chunk + 250))))
                samples.append(
                    {"leads": chunk + len(codes), "rss_mb": rss_kb(pid) / 1024, "ok": sum(c == 200 for c in codes)}
                )
                print(
                    f"{label}: {samples[-1]['leads']} leads, worker RSS {samples[-1]['rss_mb']:.0f} MB "
                    f"({samples[-1]['ok']} of {len(codes)} answered 200)",
                    flush=True,
                )
        result = {
            "label": label,
            "leads": args.leads,
            "lead_bytes": len(lead_body(0)),
            "start_rss_mb": start_kb / 1024,
            "peak_rss_mb": max(s["rss_mb"] for s in samples),
            "samples": samples,
            "machine": machine_info(),
        }
        write_json(f"journal_memory-{label}", result)
        print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "machine")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
