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
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL

from bench.common import percentiles

# The generator shares the machine's two cores with what it measures: geventhttpclient costs
# about a third of urllib3's CPU per request under gevent (bench/REPORT.md part 11), so less of
# the generator's own work lands in the latencies and on the cores.
CONNECTIONS = 1000


def client(url: str) -> HTTPClient:
    return HTTPClient.from_url(URL(url), concurrency=CONNECTIONS, connection_timeout=10, network_timeout=10)


def post(http: HTTPClient, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
    """(status, body) of one POST, the whole exchange within 10 s."""
    with gevent.Timeout(10):
        resp = http.request("POST", path, body=body, headers=headers)
        try:
            return resp.status_code, bytes(resp.read())
        finally:
            resp.release()


def run(url: str, api_key: str, rate: float, seconds: float) -> dict:
    http = client(url)
    n = int(rate * seconds)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    tag = f"ol{int(time.time())}"
    start = time.perf_counter() + 0.2

    def one(i: int, due: float) -> None:
        body = json.dumps({"lead_id": f"{tag}-{i}", "state": "TX", "email": "ada@example.com"})
        try:
            status, data = post(http, "/v1/leads", body.encode(), headers)
            key = str(status) if status != 200 else json.loads(data)["status"]
        except (Exception, gevent.Timeout) as exc:
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
    http = client(url)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    start = time.perf_counter() + 0.2

    def one(provider: str, headers: dict, body: str, due: float) -> None:
        try:
            status, data = post(
                http, f"/v1/webhooks/{provider}", body.encode(), {"Content-Type": "application/json", **headers}
            )
            key = json.loads(data).get("status") or str(status) if status in (200, 409) else str(status)
        except (Exception, gevent.Timeout) as exc:
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
