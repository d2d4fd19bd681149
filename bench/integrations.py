"""What buyer integrations cost (issue "Buyer integrations"): CPU per lead of building and
judging a templated form post against the default contract, and the latency of the ping
fan-out for 1, 3 and 10 ping/post buyers answering in 20 ms, under PING_TIMEOUT_MS=300.
Writes bench/out/integrations.{json,md,png}.

    python -m bench.integrations [--leads 20000] [--pings 300]
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()  # as in the web process: the pings fan out on greenlets

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parent.parent

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.common import OUT, machine_info, markdown_table, percentiles, write_json, write_md
from testkit.servers import RedisServer, free_port, listening, wait_until
from webhooks.caps import leases
from webhooks.leads.buyers import BuyerRule
from webhooks.leads.delivery import Deliverer, classify, judge
from webhooks.leads.integration import compile_delivery, compile_ping, parse_delivery
from webhooks.leads.publishers import PublisherRule
from webhooks.leads.routing import Offer, Outcome, Router
from webhooks.storage.redis import make_store

LEAD = {
    "first_name": "Ada",
    "last_name": "Lovelace",
    "email": "ada@example.com",
    "phone": "+15125550100",
    "state": "TX",
    "zip": "73301",
    "address": "12 Analytical Row",
    "city": "Austin",
    "age": 36,
}
FORM = {
    "method": "POST",
    "format": "form",
    "headers": {"X-Api-Key": "sk_acme_123"},
    "fields": {
        "email": "{{ lead.email }}",
        "name": "{{ lead.first_name }} {{ lead.last_name }}",
        "phone": "{{ lead.phone }}",
        "zip": "{{ lead.zip }}",
        "source": "{{ publisher_id }}",
        "ref": "{{ lead_id }}",
        "bid": "{{ price }}",
        "vendor": "floodgate",
    },
    "accept": "result == 'success'",
}
PING_TIMEOUT_MS = 300


def rule(buyer_id: str, delivery=None, ping=None, url="http://127.0.0.1:9/") -> BuyerRule:
    return BuyerRule(
        id=buyer_id,
        endpoint_url=url,
        priority=0,
        price=Decimal("12.50"),
        price_minor=1250,
        tz=ZoneInfo("UTC"),
        limits=(),
        states=frozenset(),
        blocked=frozenset(),
        schedule=None,
        dedupe_fields=(),
        dedupe_days=0,
        return_window_days=7,
        delivery=compile_delivery(delivery),
        ping=compile_ping(ping),
    )


def cpu_per_lead(n: int, rounds: int) -> list[dict]:
    """CPU (process time) of building a post and judging its reply, per lead."""
    plain, templated = rule("plain"), rule("acme", parse_delivery(FORM))
    lead_json = json.dumps(LEAD, separators=(",", ":"))
    ok_default, ok_form = b'{"accepted": true}', b'{"result": "success", "id": 7}'
    samples: dict[str, list[float]] = {"default contract": [], "templated form post": []}
    for _ in range(rounds):  # interleaved: both see the same machine
        for name, buyer, reply in (
            ("default contract", plain, ok_default),
            ("templated form post", templated, ok_form),
        ):
            offer = Offer(buyer, buyer.price)
            t = time.process_time()
            for i in range(n):
                offer.body(f"lead-{i}", "surge", LEAD, lead_json)
                if buyer.delivery.fields is None:
                    classify(200, reply)
                else:
                    judge(200, reply, buyer.delivery)
            samples[name].append((time.process_time() - t) / n * 1e6)
    return [
        {"post": name, "rounds": rounds, "leads_per_round": n, "us_per_lead_median": round(sorted(v)[len(v) // 2], 1)}
        for name, v in samples.items()
    ]


def fan_out_latency(store, pings: int, ping_url: str) -> list[dict]:
    router = Router(store, store.redis, Deliverer(1500), 1500, 5, 30_000, PING_TIMEOUT_MS)
    publisher = PublisherRule(id="surge", active=True, commission_pct=Decimal("10"))
    rows, curves = [], {}
    for k in (1, 3, 10):
        buyers = [
            rule(
                f"p{k}-{j}",
                ping={"url": ping_url, "fields": {"state": "{{ lead.state }}"}, "bid": "`9.50`", "min_bid": "1.00"},
            )
            for j in range(k)
        ]
        for b in buyers:
            leases.mark_ready(store.redis, b.id)
        ms, no_bid = [], 0
        for i in range(pings):
            out = Outcome()
            t = time.perf_counter()
            offers = router._bids(buyers, publisher, f"l{i}", LEAD, datetime.now(timezone.utc), out)
            ms.append((time.perf_counter() - t) * 1000)
            no_bid += k - len(offers)
        rows.append({"ping_buyers": k, "leads": pings, **percentiles(ms), "no_bid": no_bid})
        curves[k] = sorted(ms)
    return rows, curves


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leads", type=int, default=20_000, help="per CPU round")
    parser.add_argument("--pings", type=int, default=300, help="leads per fan-out size")
    args = parser.parse_args()
    print("CPU per lead: default contract vs templated form post", flush=True)
    cpu = cpu_per_lead(args.leads, 3)
    ratio = round(cpu[1]["us_per_lead_median"] / cpu[0]["us_per_lead_median"], 2)
    port = free_port()
    buyer = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "buyer_server.py"), str(port)],
        env={"BUYER_DELAY_MS": "20", "PATH": "/usr/bin:/bin"},
    )
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = RedisServer(Path(tmp) / "redis")
        redis_server.start()
        try:
            wait_until(lambda: listening(port), what="the ping server")
            print("ping fan-out: 1, 3 and 10 ping buyers at 20 ms", flush=True)
            fan, curves = fan_out_latency(make_store(redis_server.url), args.pings, f"http://127.0.0.1:{port}/ping")
        finally:
            redis_server.kill()
            buyer.kill()
    write_json(
        "integrations.json",
        {"machine": machine_info(), "cpu": cpu, "cpu_ratio": ratio, "fan_out": fan, "ping_timeout_ms": PING_TIMEOUT_MS},
    )
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for k, ordered in curves.items():
        ax.plot([100 * i / len(ordered) for i in range(len(ordered))], ordered, label=f"{k} ping buyer(s)")
    ax.axhline(PING_TIMEOUT_MS, color="grey", linestyle="--", label="PING_TIMEOUT_MS")
    ax.set_xlabel("percentile")
    ax.set_ylabel("ping phase of one lead (ms)")
    ax.set_title("Ping fan-out, buyers answering in 20 ms (gevent)")
    ax.legend()
    fig.tight_layout()
    OUT.mkdir(exist_ok=True)
    fig.savefig(OUT / "integrations.png", dpi=110)
    md = [
        "### CPU per lead: building the post and judging the reply (µs, median of 3 interleaved rounds)",
        "",
        markdown_table(
            cpu, (("post", "post"), ("leads per round", "leads_per_round"), ("µs per lead", "us_per_lead_median"))
        ),
        "",
        f"A templated form post (8 Jinja2 fields, a JMESPath accept rule) costs × {ratio} the default "
        "contract's body and check, in the same run.",
        "",
        f"### Ping fan-out (PING_TIMEOUT_MS={PING_TIMEOUT_MS}; ms per lead, room check included)",
        "",
        markdown_table(
            fan,
            (
                ("ping buyers", "ping_buyers"),
                ("leads", "leads"),
                ("p50", "p50"),
                ("p95", "p95"),
                ("p99", "p99"),
                ("pings without a bid", "no_bid"),
            ),
        ),
        "",
    ]
    write_md("integrations.md", "\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
