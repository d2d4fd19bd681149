"""Open-loop load: POST leads at a constant rate whatever the server answers, and measure each
latency from the moment the request was due (so a slow server cannot slow the generator down
and hide its own queueing: no coordinated omission). Runs as its own process:

    python -m bench.openloop URL API_KEY RATE SECONDS  ->  one JSON line on stdout
    python -m bench.openloop payments URL FILE RATE     ->  the same, for the payment
        deliveries listed in FILE (JSON: [[provider, headers, body], ...]), sent in order
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json
import sys
import time

import gevent
import urllib3

from bench.common import percentiles


def run(url: str, api_key: str, rate: float, seconds: float) -> dict:
    pool = urllib3.PoolManager(maxsize=1000, block=False, retries=False)
    n = int(rate * seconds)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    tag = f"ol{int(time.time())}"
    start = time.perf_counter() + 0.2

    def one(i: int, due: float) -> None:
        body = json.dumps({"lead_id": f"{tag}-{i}", "state": "TX", "email": "ada@example.com"})
        try:
            resp = pool.request(
                "POST", url + "/v1/leads", body=body, headers=headers, timeout=urllib3.Timeout(total=10)
            )
            key = str(resp.status) if resp.status != 200 else json.loads(resp.data)["status"]
        except Exception as exc:
            key = type(exc).__name__
        latencies.append((time.perf_counter() - due) * 1000)
        statuses[key] = statuses.get(key, 0) + 1

    greenlets = []
    for i in range(n):
        due = start + i / rate
        if (wait := due - time.perf_counter()) > 0:
            gevent.sleep(wait)
        greenlets.append(gevent.spawn(one, i, due))
    gevent.joinall(greenlets, timeout=30)
    elapsed = time.perf_counter() - start
    return {
        "offered_rate": rate,
        "seconds": seconds,
        "sent": n,
        "completed": len(latencies),
        "statuses": statuses,
        "achieved_rate": round(len(latencies) / elapsed, 1),
        **{k + "_ms": v for k, v in percentiles(latencies).items()},
    }


def run_payments(url: str, deliveries: list, rate: float) -> dict:
    """Send `deliveries` at `rate` per second; statuses are the answers' `status` fields."""
    pool = urllib3.PoolManager(maxsize=1000, block=False, retries=False)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    start = time.perf_counter() + 0.2

    def one(provider: str, headers: dict, body: str, due: float) -> None:
        try:
            resp = pool.request(
                "POST",
                f"{url}/v1/webhooks/{provider}",
                body=body.encode(),
                headers={"Content-Type": "application/json", **headers},
                timeout=urllib3.Timeout(total=10),
            )
            key = (
                json.loads(resp.data).get("status") or str(resp.status)
                if resp.status in (200, 409)
                else str(resp.status)
            )
        except Exception as exc:
            key = type(exc).__name__
        latencies.append((time.perf_counter() - due) * 1000)
        statuses[key] = statuses.get(key, 0) + 1

    greenlets = []
    for i, (provider, headers, body) in enumerate(deliveries):
        due = start + i / rate
        if (wait := due - time.perf_counter()) > 0:
            gevent.sleep(wait)
        greenlets.append(gevent.spawn(one, provider, headers, body, due))
    gevent.joinall(greenlets, timeout=30)
    elapsed = time.perf_counter() - start
    return {
        "offered_rate": rate,
        "seconds": round(len(deliveries) / rate, 1),
        "sent": len(deliveries),
        "completed": len(latencies),
        "statuses": statuses,
        "achieved_rate": round(len(latencies) / elapsed, 1),
        **{k + "_ms": v for k, v in percentiles(latencies).items()},
    }


if __name__ == "__main__":
    if sys.argv[1] == "payments":
        with open(sys.argv[3]) as f:
            print(json.dumps(run_payments(sys.argv[2], json.load(f), float(sys.argv[4]))))
    else:
        print(json.dumps(run(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))))
