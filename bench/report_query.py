"""The leads report's query time over a month of a busy network, on MariaDB: 6,000,000 ledger
rows (200,000 leads a day for 30 days, 20 publishers, 17 buyers; 60 % sold, 30 % unsold, 10 %
returned), counted into `lead_stats` by the migration's own statement (sql/009_lead_stats.sql,
the same figures the settlements keep), then `reports.report` for a month by publisher, buyer,
day and hour (median of 5 each), its query plan, and, beside it, the same figures aggregated
from the leads table directly (what the report would cost without its hourly figures).

    python -m bench.report_query [--rows 6000000]

Needs MariaDB/MySQL (FG_TEST_MYSQL, default root@127.0.0.1:3306); a throw-away database.
Prints a table; writes bench/out/report_query.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date, datetime, timedelta

from peewee import OperationalError

from bench.common import machine_info, write_json
from testkit.servers import create_mysql_db, mysql_admin_url
from webhooks.leads import reports
from webhooks.storage.db import db, init_db
from webhooks.storage.migrate import SQL_DIR, split_statements, upgrade

START = datetime(2026, 11, 1)
DAYS = 30
CHUNK = 500_000

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
DIRECT = """
SELECT publisher_id, COUNT(*), SUM(status IN ('sold', 'returned')), SUM(status = 'returned'),
       SUM(CASE WHEN status = 'sold' THEN price ELSE 0 END),
       SUM(CASE WHEN status = 'sold' THEN commission ELSE 0 END)
FROM leads WHERE received_at >= %s AND received_at < %s AND status IN ('sold', 'unsold', 'returned')
GROUP BY publisher_id
"""


def timed(fn, rounds: int) -> tuple[float, list[float]]:
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=6_000_000)
    args = parser.parse_args()
    admin = mysql_admin_url()
    if admin is None:
        raise SystemExit("MariaDB/MySQL is not reachable (FG_TEST_MYSQL): this bench measures the MySQL path")
    url, drop = create_mysql_db(admin)
    out: dict = {"machine": machine_info(), "rows": args.rows}
    try:
        init_db(url, pool_size=2)
        with db.connection_context():
            upgrade(echo=lambda _line: None)
            spread = DAYS * 86400 / (args.rows + 1)  # the last lead before the month ends
            started = time.perf_counter()
            for first in range(1, args.rows + 1, CHUNK):
                last = min(first + CHUNK - 1, args.rows)
                with db.atomic():
                    db.execute_sql(FILL.format(spread=spread, start=START, first=first, last=last))
                print(f"  {last:,} leads written ({time.perf_counter() - started:.0f} s)", flush=True)
            out["fill_s"] = time.perf_counter() - started
            db.execute_sql("DELETE FROM lead_stats")
            backfill = split_statements((SQL_DIR / "009_lead_stats.sql").read_text())[-1]
            started = time.perf_counter()
            for day in range(DAYS):  # the migration's statement a day at a time (each under the read timeout)
                lo, hi = START + timedelta(days=day), START + timedelta(days=day + 1)
                bounded = backfill.replace(
                    "WHERE status IN", f"WHERE received_at >= '{lo}' AND received_at < '{hi}' AND status IN"
                )
                with db.atomic():
                    db.execute_sql(bounded)
            out["stats_build_s"] = time.perf_counter() - started
            out["stats_rows"] = db.execute_sql("SELECT COUNT(*) FROM lead_stats").fetchone()[0]
            first_day, last_day = date(2026, 11, 1), date(2026, 11, 30)
            out["report_s"] = {}
            for group_by in reports.GROUPS:
                median, seconds = timed(lambda g=group_by: reports.report(first_day, last_day, g), 5)
                out["report_s"][group_by] = {"median": median, "all": seconds}
            totals = reports.report(first_day, last_day, "publisher")["totals"]
            assert totals["leads"] == args.rows, totals
            query = reports.report_query(first_day, last_day, "publisher")
            sql, params = query.sql()
            out["plan"] = [list(r) for r in db.execute_sql("EXPLAIN " + sql, params).fetchall()]
            for group_by, t in out["report_s"].items():
                print(f"  report by {group_by}: {t['median'] * 1000:.1f} ms (median of 5)", flush=True)
            window = (datetime(2026, 11, 1), datetime(2026, 12, 1))
            started = time.perf_counter()
            try:  # once: on a month of leads it may outlive the connection's read timeout (30 s)
                db.execute_sql(DIRECT, window).fetchall()
                out["direct_s"] = {"median": time.perf_counter() - started, "all": [time.perf_counter() - started]}
            except OperationalError as exc:
                out["direct_s"] = {"median": None, "error": f"{exc} after {time.perf_counter() - started:.0f} s"}
    finally:
        db.close()
        drop()
    print(f"\n{args.rows:,} ledger rows, {out['stats_rows']:,} hourly rows (built in {out['stats_build_s']:.1f} s)")
    print("| query (a month) | median of 5 |")
    print("|---|---|")
    for group_by, t in out["report_s"].items():
        print(f"| report by {group_by} (lead_stats) | {t['median'] * 1000:.1f} ms |")
    direct = out["direct_s"]
    shown = f"{direct['median'] * 1000:.0f} ms" if direct["median"] is not None else direct["error"]
    print(f"| the same by publisher from the leads table directly (once) | {shown} |")
    print("plan:", out["plan"])
    write_json("report_query.json", out)


if __name__ == "__main__":
    main()
