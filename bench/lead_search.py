"""The lead search (GET /v1/admin/leads) over a month of a busy network, on MariaDB: 6,000,000
ledger rows (200,000 leads a day for 30 days, 20 publishers, 17 buyers; 60 % sold, 30 % unsold,
10 % returned; one attempt each), then `search.search` of a page of 100 for each filter, the
first page and a deep one (a cursor in the middle of the month), median of 5, and each query's
plan (which index MariaDB picks).

    python -m bench.lead_search [--rows 6000000]

Needs MariaDB/MySQL (FG_TEST_MYSQL, default root@127.0.0.1:3306); a throw-away database.
Prints a table; writes bench/out/lead_search.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from bench.common import machine_info, markdown_table, write_json
from testkit.servers import create_mysql_db, mysql_admin_url
from webhooks.leads.accounting import search
from webhooks.leads.accounting.search import LeadQuery, encode_cursor
from webhooks.storage.records.db import db, init_db
from webhooks.storage.records.migrate import upgrade

START = datetime(2026, 11, 1)
DAYS = 30
CHUNK = 250_000
ROUNDS = 5

# bench/history/2026-12-02-report-query.md's generator: seq_1_to_N is MariaDB's sequence engine
FILL = """
INSERT INTO leads (publisher_id, lead_id, status, buyer_id, price, commission, payload,
                   received_at, sold_at, settled_at)
SELECT CONCAT('pub-', MOD(seq, 20)), CONCAT('lead-', seq),
       CASE WHEN MOD(seq, 10) < 6 THEN 'sold' WHEN MOD(seq, 10) < 9 THEN 'unsold' ELSE 'returned' END,
       CASE WHEN MOD(seq, 10) < 6 OR MOD(seq, 10) = 9 THEN CONCAT('buyer-', MOD(seq, 17)) END,
       CASE WHEN MOD(seq, 10) < 6 OR MOD(seq, 10) = 9 THEN 5 + MOD(seq, 20) END,
       CASE WHEN MOD(seq, 10) < 6 OR MOD(seq, 10) = 9 THEN 0.50 + MOD(seq, 20) / 10 END,
       '',
       TIMESTAMPADD(SECOND, FLOOR(seq * {spread}), '{start}'),
       CASE WHEN MOD(seq, 10) < 6 OR MOD(seq, 10) = 9 THEN TIMESTAMPADD(SECOND, FLOOR(seq * {spread}), '{start}') END,
       TIMESTAMPADD(SECOND, FLOOR(seq * {spread}), '{start}')
FROM seq_{first}_to_{last}
"""
ATTEMPTS = """
INSERT INTO lead_attempts (publisher_id, lead_id, seq, buyer_id, outcome, ms)
SELECT CONCAT('pub-', MOD(seq, 20)), CONCAT('lead-', seq), 0, CONCAT('buyer-', MOD(seq, 17)),
       CASE WHEN MOD(seq, 10) < 6 OR MOD(seq, 10) = 9 THEN 'accepted' ELSE 'rejected' END, 120
FROM seq_{first}_to_{last}
"""

UTC = timezone.utc
DAY = datetime(2026, 11, 15, tzinfo=UTC)
SEARCHES: dict[str, LeadQuery] = {
    "no filter": LeadQuery(),
    "publisher_id": LeadQuery(publisher_id="pub-7"),
    "buyer_id": LeadQuery(buyer_id="buyer-3"),
    "status=sold": LeadQuery(status="sold"),
    "status=returned": LeadQuery(status="returned"),
    "since + until (one day)": LeadQuery(since=DAY, until=DAY + timedelta(days=1)),
    "buyer_id + status=sold": LeadQuery(buyer_id="buyer-3", status="sold"),
    "publisher_id + buyer_id (none match)": LeadQuery(publisher_id="pub-7", buyer_id="buyer-3"),
    "publisher_id + status (none match)": LeadQuery(publisher_id="pub-7", status="returned"),
}


def timed(fn: Callable[[], Any]) -> float:
    seconds = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def fill(rows: int) -> float:
    spread = DAYS * 86400 / (rows + 1)  # the last lead before the month ends
    started = time.perf_counter()
    for first in range(1, rows + 1, CHUNK):
        last = min(first + CHUNK - 1, rows)
        with db.atomic():
            db.execute_sql(FILL.format(spread=spread, start=START, first=first, last=last))
            db.execute_sql(ATTEMPTS.format(first=first, last=last))
        print(f"  {last:,} leads written ({time.perf_counter() - started:.0f} s)", flush=True)
    db.execute_sql("ANALYZE TABLE leads")
    return time.perf_counter() - started


def measure(name: str, query: LeadQuery) -> dict[str, Any]:
    deep = encode_cursor([datetime(2026, 11, 16, 12).isoformat(), 10**12])  # mid-month
    first = timed(lambda: search.search(query))
    deep_s = timed(lambda: search.search(query, cursor=deep))
    found = len(search.search(query, cursor=deep).items)
    sql, params = search.page_query(query, limit=search.DEFAULT_LIMIT, cursor=deep).sql()
    plan = db.execute_sql("EXPLAIN " + sql, params).fetchall()
    key = f"{plan[0][5]} ({plan[0][3]})"  # id, select_type, table, type, possible_keys, key, ...
    row = {"search": name, "first_ms": first * 1000, "deep_ms": deep_s * 1000, "items": found, "index": key}
    print(f"  {name}: first {row['first_ms']:.1f} ms, deep {row['deep_ms']:.1f} ms ({found} items, {key})", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=6_000_000)
    args = parser.parse_args()
    admin = mysql_admin_url()
    if admin is None:
        raise SystemExit("MariaDB/MySQL is not reachable (FG_TEST_MYSQL): this bench measures the MySQL path")
    url, drop = create_mysql_db(admin)
    out: dict[str, Any] = {"machine": machine_info(), "rows": args.rows}
    try:
        init_db(url, pool_size=2)
        with db.connection_context():
            upgrade(echo=lambda _line: None)
            out["fill_s"] = fill(args.rows)
            out["searches"] = [measure(name, query) for name, query in SEARCHES.items()]
    finally:
        db.close()
        drop()
    print(
        f"\n{args.rows:,} leads (written in {out['fill_s']:.0f} s); a page of {search.DEFAULT_LIMIT}, median of {ROUNDS}"
    )
    columns = (
        ("search", "search"),
        ("first page (ms)", "first_ms"),
        ("mid-month cursor (ms)", "deep_ms"),
        ("index (access) MariaDB picks", "index"),
    )
    print(
        markdown_table(
            [{**r, "first_ms": f"{r['first_ms']:.1f}", "deep_ms": f"{r['deep_ms']:.1f}"} for r in out["searches"]],
            columns,
        )
    )
    write_json("lead_search.json", out)


if __name__ == "__main__":
    main()
