"""Slow clients against the web process (issue 35 item 2): a clean publisher's lead latency
alone and under 2,200 connections trickling bodies one byte every 5 s, and the web workers'
RSS before, at the peak of and after 800 connections sending 256 KiB chunked bodies (never
finished). Loopback only; bounded in connections and in time.

    python -m bench.slow_clients [--code DIR] [--label L] [--slow 2200] [--chunked 800]

`--code DIR` runs the web process from another checkout (a `git worktree` of an older
commit) with this checkout's venv. Writes bench/out/slow_clients-<label>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent

from bench import stack
from bench.common import machine_info, paced_threads, percentiles, write_json
from testkit.payments import child_pids
from testkit.servers import listening, wait_until
from testkit.slow_clients import SlowClients, chunked, raise_open_files, sockets_held, trickled

API_KEY = "pk_bench_slow_0123456789"
CLIENT_TIMEOUT_S = 10
POOLS = 200  # sockets the workers' Redis and database pools may open beyond the idle count
LEADS, LEADS_S = 300, 30  # clean leads per phase, over this long (three read deadlines)


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return round(total / 1024, 1)


def clean_leads(url: str, tag: str) -> dict:
    """LEADS leads from 8 threads over LEADS_S: latency of the answered ones, the rest counted."""

    def post(i: int) -> float | str:
        started = time.perf_counter()
        try:
            resp = requests.post(
                url + "/v1/leads",
                json={"lead_id": f"{tag}-{i}", "state": "TX", "email": f"{tag}{i}@example.com"},
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=CLIENT_TIMEOUT_S,
            )
        except requests.RequestException as exc:
            return type(exc).__name__
        if resp.status_code != 200 or resp.json().get("status") != "sold":
            return f"{resp.status_code} {resp.text[:80]}"
        return (time.perf_counter() - started) * 1000

    run = paced_threads(8, LEADS, LEADS_S, post, deadline_s=LEADS_S + 30)
    ms = [r for r in run.results if isinstance(r, float)]
    failed = [r for r in run.results if not isinstance(r, float)]
    return {
        "answered": len(ms),
        "failed": len(failed),
        "failures": sorted({str(f) for f in failed})[:5],
        "median_ms": round(statistics.median(ms), 1) if ms else None,
        "p99_ms": percentiles(ms)["p99"],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout the web process runs")
    ap.add_argument("--label", default="")
    ap.add_argument("--slow", type=int, default=2200)
    ap.add_argument("--chunked", type=int, default=800)
    args = ap.parse_args()
    label = args.label or ("this-checkout" if args.code == ROOT else args.code.name)
    raise_open_files(args.slow + 1024)
    result: dict = {"label": label, "slow": args.slow, "chunked": args.chunked}
    with ExitStack() as es, tempfile.TemporaryDirectory() as tmp_s:
        # Paystack configured: its webhook view reads the body (an unconfigured one is 503 unread).
        base = stack.base(es, Path(tmp_s), {"PAYSTACK_SECRET_KEY": "sk_bench_slow_0123456789"}, code=args.code)
        _, buyer_url = base.buyer_stub(es)
        web = base.web(es, workers=2)
        wait_until(lambda: listening(int(buyer_url.split(":")[2].split("/")[0])), what="the buyer stub")
        admin = {"Authorization": f"Bearer {stack.ADMIN}"}
        requests.put(
            f"{web.url}/v1/admin/publishers/calm", headers=admin, timeout=10, json={"name": "Calm", "api_key": API_KEY}
        ).raise_for_status()
        requests.put(
            f"{web.url}/v1/admin/buyers/acme",
            headers=admin,
            timeout=10,
            json={"name": "Acme", "endpoint_url": buyer_url, "priority": 1, "price": "10.00", "timezone": "UTC"},
        ).raise_for_status()
        time.sleep(1.2)  # the config version reaches both workers (CONFIG_CHECK_INTERVAL_MS 500)
        workers = child_pids(web.pid)
        idle_sockets = sockets_held(workers)
        result["rss_idle_mb"] = rss_mb(workers)
        result["alone"] = clean_leads(web.url, "alone")
        print(label, "alone", result["alone"], flush=True)

        attack = [trickled("/v1/webhooks/paystack")] * 10 + [trickled("/healthz")]
        with SlowClients(web.port, attack, count=args.slow, interval_s=5, max_s=LEADS_S + 120) as slow:
            try:
                wait_until(lambda: sockets_held(workers) - idle_sockets >= args.slow - 50, timeout=30)
            except AssertionError:
                pass  # a server that cannot hold them all: measured as it is
            result["slow_held"] = sockets_held(workers) - idle_sockets
            result["rss_slow_mb"] = rss_mb(workers)
            result["under_slow"] = clean_leads(web.url, "slow")
            result["slow_closed_by_server"] = slow.closed_by_server
        print(label, "under slow bodies", result["under_slow"], flush=True)
        wait_until(lambda: sockets_held(workers) - idle_sockets < POOLS, timeout=60, what="the slow connections gone")

        before = rss_mb(workers)
        peak = before
        with SlowClients(web.port, [chunked("/v1/webhooks/paystack")], count=args.chunked, interval_s=5) as big:
            ends = time.monotonic() + 60
            while time.monotonic() < ends and (big.fast_sent < args.chunked or big.closed_by_server < args.chunked):
                peak = max(peak, rss_mb(workers))
                time.sleep(0.2)
            result["chunked_sent"] = big.fast_sent
            result["chunked_closed_by_server"] = big.closed_by_server
        wait_until(
            lambda: sockets_held(workers) - idle_sockets < POOLS, timeout=60, what="the chunked connections gone"
        )
        result.update(rss_chunked_before_mb=before, rss_chunked_peak_mb=peak, rss_chunked_after_mb=rss_mb(workers))
        result["machine"] = machine_info()
    write_json(f"slow_clients-{label}", result)
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
