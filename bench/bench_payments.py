"""Payment webhook benchmark: latency of first deliveries and of duplicates, and the invariants.

Starts a private redis-server, a throw-away MariaDB database and the app under gunicorn+gevent
(testkit/servers.py), then sends 2,000 distinct payments x 5 deliveries at concurrency 50 twice:
"burst" (each payment's 5 deliveries back to back, as a provider retrying a timed-out socket
fires them) and "shuffled" (the 10,000 deliveries in random order). Client-side latency is
measured around each request; server-side latency comes from the Server-Timing header the
view sets (verify + parse + dedupe = the "verification and dedupe" the seed article quotes).
Results go to bench/out/payments.{json,md,png}.

    python -m bench.bench_payments [--payments 2000] [--repeats 5] [--concurrency 50]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent

from bench import stack
from bench.common import OUT, machine_info, markdown_table, percentiles, write_json, write_md
from testkit.config import SECRETS
from testkit.payments import PROVIDERS, deliver, encode, payload
from webhooks.storage.records.db import db, init_db
from webhooks.storage.records.models import Payment, Wallet


def latency(values: list[float]) -> dict:
    """Count, p50/p95/p99 (bench.common, nearest rank) and max of `values` in ms."""
    return {
        "n": len(values),
        **{k + "_ms": v for k, v in percentiles(values).items()},
        "max_ms": round(max(values), 2) if values else None,
    }


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
        return {
            "reference": reference,
            "status": status,
            "client_ms": client_ms,
            "server": server_timing(resp.headers.get("Server-Timing", "")),
        }

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, deliveries))


def summarise(results: list[dict], seconds: float) -> dict:
    by_status = defaultdict(list)
    for r in results:
        by_status[r["status"]].append(r)
    summary = {
        "deliveries": len(results),
        "seconds": round(seconds, 2),
        "deliveries_per_s": round(len(results) / seconds, 1),
        "statuses": dict(Counter(r["status"] for r in results)),
    }
    labels = (("credited", "first_deliveries"), ("duplicate", "duplicates"), ("in_flight", "in_flight"))
    for status, label in labels:
        rows = by_status.get(status, [])
        decide = [sum(r["server"].get(k, 0.0) for k in ("verify", "parse", "dedupe")) for r in rows if r["server"]]
        summary[label] = {
            "client": latency([r["client_ms"] for r in rows]),
            "server_verify_dedupe": latency(decide),
            "server_total": latency([r["server"]["total"] for r in rows if "total" in r["server"]]),
        }
    return summary


def check_ledger(payments: list, expected: dict, results: list[dict]) -> dict:
    credited = Counter(r["reference"] for r in results if r["status"] == "credited")
    with db.connection_context():
        stored = {
            p.reference
            for p in Payment.select(Payment.reference).where(Payment.reference.in_([ref for ref, _p, _raw in payments]))
        }
        wallets = {
            (w.customer, w.currency): w.balance_minor for w in Wallet.select() if (w.customer, w.currency) in expected
        }
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
    with ExitStack() as es, tempfile.TemporaryDirectory(prefix="fg-bench-") as tmp:
        base = stack.base(es, Path(tmp), SECRETS, mysql_only=True)
        init_db(base.db_url, pool_size=4)
        es.callback(db.close)
        web = base.web(es, workers=args.workers)
        rng = random.Random(7)
        report = {
            "machine": machine_info(),
            "setup": {
                "payments": args.payments,
                "repeats": args.repeats,
                "concurrency": args.concurrency,
                "gunicorn_workers": args.workers,
                "database": "MariaDB",
                "redis": "private redis-server",
            },
        }
        for phase in ("burst", "shuffled"):
            payments, expected = make_payments(args.payments, phase, rng)
            deliveries = [p for p in payments for _ in range(args.repeats)]
            if phase == "shuffled":
                rng.shuffle(deliveries)
            started = time.perf_counter()
            results = run_phase(web.url, deliveries, args.concurrency)
            report[phase] = {
                **summarise(results, time.perf_counter() - started),
                **check_ledger(payments, expected, results),
            }
        write_json("payments.json", report)
        write_md("payments.md", render(report))
        plot(report, OUT / "payments.png")
        print(render(report))
        ok = all(report[p]["double_credits"] == 0 and report[p]["lost_payments"] == 0 for p in ("burst", "shuffled"))
        return 0 if ok else 1


def render(report: dict) -> str:
    rows = []
    for phase in ("burst", "shuffled"):
        p = report[phase]
        for label in ("first_deliveries", "duplicates"):
            q = p[label]
            rows.append(
                {
                    "phase": phase,
                    "kind": label.replace("_", " "),
                    "n": q["client"]["n"],
                    "s50": q["server_verify_dedupe"]["p50_ms"],
                    "s99": q["server_verify_dedupe"]["p99_ms"],
                    "t50": q["server_total"]["p50_ms"],
                    "t99": q["server_total"]["p99_ms"],
                    "c50": q["client"]["p50_ms"],
                    "c99": q["client"]["p99_ms"],
                }
            )
    table = markdown_table(
        rows,
        (
            ("phase", "phase"),
            ("deliveries", "kind"),
            ("n", "n"),
            ("server verify+dedupe p50 ms", "s50"),
            ("p99 ms", "s99"),
            ("server total p50 ms", "t50"),
            ("p99 ms", "t99"),
            ("client p50 ms", "c50"),
            ("p99 ms", "c99"),
        ),
    )
    s = report["setup"]
    lines = [
        f"{s['payments']} distinct payments × {s['repeats']} deliveries each, concurrency "
        f"{s['concurrency']}, {s['gunicorn_workers']} gunicorn workers, {s['database']}.",
        "",
        table,
        "",
    ]
    for phase in ("burst", "shuffled"):
        p = report[phase]
        lines.append(
            f"- {phase}: {p['deliveries_per_s']} deliveries/s, outcomes {p['statuses']}; "
            f"double credits **{p['double_credits']}**, lost payments **{p['lost_payments']}**, "
            f"wallets off {p['wallets_off']}."
        )
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, phase in zip(axes, ("burst", "shuffled")):
        labels, p50, p99 = [], [], []
        for label in ("first_deliveries", "duplicates"):
            for part in ("server_verify_dedupe", "server_total", "client"):
                q = report[phase][label][part]
                labels.append(f"{label.split('_')[0]}\n{part.replace('server_', '').replace('_', '+')}")
                p50.append(q["p50_ms"] or 0)
                p99.append(q["p99_ms"] or 0)
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], p50, 0.4, label="p50")
        ax.bar([i + 0.2 for i in x], p99, 0.4, label="p99")
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(
            f"{phase}: double credits {report[phase]['double_credits']}, lost {report[phase]['lost_payments']}"
        )
    axes[0].set_ylabel("ms (log)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
