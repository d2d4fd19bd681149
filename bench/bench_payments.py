"""Payment webhook benchmark: latency of first deliveries and of duplicates, and the invariants.

Starts a private redis-server, a throw-away MariaDB database and the app under gunicorn+gevent
(tests/servers.py), then sends 2,000 distinct payments x 5 deliveries at concurrency 50 twice:
"burst" (each payment's 5 deliveries back to back, as a provider retrying a timed-out socket
fires them) and "shuffled" (the 10,000 deliveries in random order). Client-side latency is
measured around each request; server-side latency comes from the Server-Timing header the
view sets (verify + parse + dedupe = the "verification and dedupe" the seed article quotes).
Results go to bench/out/payments.json.

    python bench/bench_payments.py [--payments 2000] [--repeats 5] [--concurrency 50]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import SECRETS  # noqa: E402
from tests.payments_helpers import PROVIDERS, deliver, encode, payload  # noqa: E402
from tests.servers import RedisServer, WebServer, create_mysql_db, mysql_admin_url  # noqa: E402
from webhooks.db import db, init_db  # noqa: E402
from webhooks.migrate import upgrade  # noqa: E402
from webhooks.models import Payment, Wallet  # noqa: E402

OUT = ROOT / "bench" / "out" / "payments.json"


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"n": len(ordered), "p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": round(ordered[-1], 2)}


def server_timing(header: str) -> dict[str, float]:
    parts = {}
    for item in header.split(","):
        name, _, dur = item.strip().partition(";dur=")
        if dur:
            parts[name] = float(dur)
    return parts


def make_payments(n: int, tag: str, rng: random.Random) -> tuple[list, dict]:
    payments, expected = [], defaultdict(int)
    for i in range(n):
        provider = PROVIDERS[i % len(PROVIDERS)]
        currency = rng.choice(["NGN", "USD", "GHS", "KES"])
        customer = f"{tag}-payer{rng.randrange(200)}@example.com"
        amount, reference = rng.randint(100, 50_000_000), f"{tag}-{i}"
        raw = encode(payload(provider, reference, amount, currency, customer))
        payments.append((reference, provider, raw))
        expected[(customer, currency)] += amount
    return payments, expected


def run_phase(base: str, deliveries: list, concurrency: int) -> list[dict]:
    local = threading.local()

    def one(item) -> dict:
        reference, provider, raw = item
        if not hasattr(local, "session"):
            local.session = requests.Session()
        started = time.perf_counter()
        resp = deliver(base, provider, raw, session=local.session)
        client_ms = (time.perf_counter() - started) * 1000
        status = resp.json().get("status") if resp.status_code in (200, 409) else f"http_{resp.status_code}"
        return {"reference": reference, "status": status, "client_ms": client_ms,
                "server": server_timing(resp.headers.get("Server-Timing", ""))}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, deliveries))


def summarise(results: list[dict], seconds: float) -> dict:
    by_status = defaultdict(list)
    for r in results:
        by_status[r["status"]].append(r)
    summary = {"deliveries": len(results), "seconds": round(seconds, 2),
               "deliveries_per_s": round(len(results) / seconds, 1),
               "statuses": dict(Counter(r["status"] for r in results))}
    labels = (("credited", "first_deliveries"), ("duplicate", "duplicates"), ("in_flight", "in_flight"))
    for status, label in labels:
        rows = by_status.get(status, [])
        decide = [sum(r["server"].get(k, 0.0) for k in ("verify", "parse", "dedupe"))
                  for r in rows if r["server"]]
        summary[label] = {
            "client": percentiles([r["client_ms"] for r in rows]),
            "server_verify_dedupe": percentiles(decide),
            "server_total": percentiles([r["server"]["total"] for r in rows if "total" in r["server"]]),
        }
    return summary


def check_ledger(payments: list, expected: dict, results: list[dict]) -> dict:
    credited = Counter(r["reference"] for r in results if r["status"] == "credited")
    with db.connection_context():
        stored = {p.reference for p in Payment.select(Payment.reference).where(
            Payment.reference.in_([ref for ref, _p, _raw in payments]))}
        wallets = {(w.customer, w.currency): w.balance_minor for w in Wallet.select()
                   if (w.customer, w.currency) in expected}
    return {
        "double_credits": sum(1 for n in credited.values() if n > 1)
        + sum(1 for k, v in expected.items() if wallets.get(k, 0) > v),
        "lost_payments": sum(1 for ref, _p, _raw in payments if ref not in stored),
        "wallets_off": sum(1 for k, v in expected.items() if wallets.get(k) != v),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payments", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    admin = mysql_admin_url()
    if not admin:
        print("MariaDB/MySQL not reachable (FG_TEST_MYSQL); the bench measures the MySQL path only")
        return 2
    work = Path(tempfile.mkdtemp(prefix="fg-bench-"))
    redis_server = RedisServer(work / "redis")
    redis_server.start()
    url, drop = create_mysql_db(admin)
    web = None
    try:
        init_db(url, pool_size=4)
        upgrade(echo=lambda _m: None)
        env = {**os.environ, **SECRETS, "REDIS_URL": redis_server.url, "DATABASE_URL": url,
               "ADMIN_TOKEN": "bench-admin-token-0123456789"}
        web = WebServer(env, work / "web.log", workers=args.workers)
        rng = random.Random(7)
        report = {"setup": {"payments": args.payments, "repeats": args.repeats,
                            "concurrency": args.concurrency, "gunicorn_workers": args.workers,
                            "cpus": os.cpu_count(), "database": "MariaDB", "redis": "private redis-server"}}
        for phase in ("burst", "shuffled"):
            payments, expected = make_payments(args.payments, phase, rng)
            deliveries = [p for p in payments for _ in range(args.repeats)]
            if phase == "shuffled":
                rng.shuffle(deliveries)
            started = time.perf_counter()
            results = run_phase(web.url, deliveries, args.concurrency)
            report[phase] = {**summarise(results, time.perf_counter() - started),
                             **check_ledger(payments, expected, results)}
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
        ok = all(report[p]["double_credits"] == 0 and report[p]["lost_payments"] == 0
                 for p in ("burst", "shuffled"))
        return 0 if ok else 1
    finally:
        if web is not None:
            web.stop()
        db.close()
        drop()
        redis_server.kill()


if __name__ == "__main__":
    sys.exit(main())
