"""What one lead leaves behind, before and after the bounds of issue #35 (API.md "Data kept per
lead is bounded"):

- Redis bytes per remembered lead_id: the claim's answer as JSON (before) and in the compact
  form of webhooks/leads/answers.py (after), for a sold lead with 1 and 3 attempts, each key
  with its 7-day expiry; MEMORY USAGE per key and used_memory's growth per key (which also
  counts the expiry's entry).
- Database bytes per lead body: leads of ~250 KB settled into the ledger, then their bodies
  emptied by the retention purge (leads/ledger.py purge_bodies); the body bytes the ledger
  holds (LENGTH(payload)) and, on MariaDB, InnoDB's data_length of the table.

    python -m bench.lead_memory [--keys 2000] [--leads 40]

Loopback only: a private redis-server and a throw-away database (MariaDB on 127.0.0.1:3306
when it answers, else SQLite). Writes bench/out/lead_memory.json and prints its tables.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

from bench.common import machine_info, write_json
from testkit.servers import RedisServer, create_mysql_db, mysql_admin_url
from webhooks.leads import answers, ledger, settlement
from webhooks.leads.publishers import PublisherRule
from webhooks.leads.routing import Outcome
from webhooks.storage import keys
from webhooks.storage.db import db, init_db, is_mysql
from webhooks.storage.migrate import upgrade
from webhooks.storage.models import Lead, Publisher

WEEK_S = 7 * 24 * 3600
ATTEMPTS = [
    {"buyer_id": "zen", "outcome": "timeout", "ms": 1500},
    {"buyer_id": "kilo", "outcome": "rejected", "ms": 212},
    {"buyer_id": "acme", "outcome": "accepted", "ms": 41},
]


def _answer(lead_id: str, attempts: list[dict]) -> dict:
    return {"lead_id": lead_id, "status": "sold", "buyer_id": "acme", "price": "12.50", "attempts": attempts}


def redis_bytes(n: int) -> list[dict]:
    """Per form and attempt count: MEMORY USAGE per key (mean, max) and used_memory per key."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            r = server.client()
            for attempts in (ATTEMPTS[2:], ATTEMPTS):
                for form, encode in (("JSON (before)", json.dumps), ("compact (after)", answers.remember)):
                    r.flushall()
                    base = int(r.info("memory")["used_memory"])
                    ids = [uuid.uuid4().hex for _ in range(n)]  # as a lead without lead_id gets
                    with r.pipeline(transaction=False) as p:
                        for lead_id in ids:
                            p.set(keys.lead_claim("surge", lead_id), encode(_answer(lead_id, attempts)), ex=WEEK_S)
                        p.execute()
                    grown = int(r.info("memory")["used_memory"]) - base
                    usage = [int(r.memory_usage(keys.lead_claim("surge", i), samples=0)) for i in ids]
                    rows.append(
                        {
                            "form": form,
                            "attempts": len(attempts),
                            "memory_usage_mean": round(sum(usage) / n, 1),
                            "memory_usage_max": max(usage),
                            "used_memory_per_key": round(grown / n, 1),
                        }
                    )
        finally:
            server.kill()
    return rows


def _body(i: int, size: int) -> str:
    rng = random.Random(i)
    return json.dumps({"lead_id": f"big-{i}", "state": "TX", "note": rng.randbytes(size // 2).hex()})


def database_bytes(n: int, size: int) -> dict:
    """Body bytes per lead in the ledger after settling `n` unsold leads of ~`size` bytes
    received 31 days ago, and after the retention purge."""
    admin = mysql_admin_url()
    tmp = tempfile.TemporaryDirectory()
    url, drop = create_mysql_db(admin) if admin else (f"sqlite:///{tmp.name}/ledger.sqlite3", lambda: None)
    init_db(url, pool_size=2)
    try:
        upgrade(echo=lambda _m: None)
        pub = PublisherRule(id="surge", active=True, commission_pct=Decimal("10"))
        at = datetime.now(timezone.utc) - timedelta(days=31)
        with db.connection_context():
            Publisher.create(id="surge", name="Surge", api_key_hash="h" * 64, api_key_hint="abcd", commission_pct=10)
            for i in range(n):
                ledger.settle([settlement.make_item(pub, f"big-{i}", Outcome(), _body(i, size), at, None)])
            before = _measure(n)
            with tempfile.TemporaryDirectory() as rtmp:
                server = RedisServer(Path(rtmp))
                server.start()
                try:
                    emptied = ledger.purge_bodies(server.client(), ledger.kept(30, 365), datetime.now(timezone.utc))
                finally:
                    server.kill()
            after = _measure(n)
        return {
            "engine": "MariaDB" if admin else "SQLite",
            "leads": n,
            "body_bytes": size,
            "emptied": emptied,
            "before": before,
            "after": after,
        }
    finally:
        db.close()
        drop()
        tmp.cleanup()


def _measure(n: int) -> dict:
    held = sum(len(p.encode()) for (p,) in Lead.select(Lead.payload).tuples())
    out: dict = {"body_bytes_per_lead": round(held / n)}
    if is_mysql():
        db.execute_sql("ANALYZE TABLE leads")
        data, index = db.execute_sql(
            "SELECT data_length, index_length FROM information_schema.TABLES"
            " WHERE table_schema = DATABASE() AND table_name = 'leads'"
        ).fetchone()
        out["innodb_bytes_per_lead"] = round((int(data) + int(index)) / n)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=2000, help="remembered lead_ids per form")
    ap.add_argument("--leads", type=int, default=40, help="leads of --size bytes in the ledger")
    ap.add_argument("--size", type=int, default=250_000)
    args = ap.parse_args()
    result = {
        "machine": machine_info(),
        "redis": redis_bytes(args.keys),
        "database": database_bytes(args.leads, args.size),
    }
    write_json("lead_memory.json", result)
    print("| form | attempts | MEMORY USAGE mean | max | used_memory per key |")
    print("|---|---|---|---|---|")
    for row in result["redis"]:
        print(
            f"| {row['form']} | {row['attempts']} | {row['memory_usage_mean']} | {row['memory_usage_max']} "
            f"| {row['used_memory_per_key']} |"
        )
    d = result["database"]
    print(f"\n{d['engine']}, {d['leads']} unsold leads of {d['body_bytes']} bytes received 31 days ago:")
    print("| | body bytes per lead | InnoDB bytes per lead |")
    print("|---|---|---|")
    for when in ("before", "after"):
        print(f"| {when} the purge | {d[when]['body_bytes_per_lead']} | {d[when].get('innodb_bytes_per_lead', '-')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
