"""Open-loop load: POST leads at a constant rate whatever the server answers, and measure each
latency from the moment the request was due (so a slow server cannot slow the generator down
and hide its own queueing: no coordinated omission). Runs as its own process:

    python bench/openloop.py URL API_KEY RATE SECONDS  ->  one JSON line on stdout
"""
from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json
import sys
import time

import gevent
import urllib3

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
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
            resp = pool.request("POST", url + "/v1/leads", body=body, headers=headers,
                                timeout=urllib3.Timeout(total=10))
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
    return {"offered_rate": rate, "seconds": seconds, "sent": n, "completed": len(latencies),
            "statuses": statuses, "achieved_rate": round(len(latencies) / elapsed, 1),
            **{k + "_ms": v for k, v in percentiles(latencies).items()}}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))))
