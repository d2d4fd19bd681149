"""Every console (/ops) and portal (/portal) page at the size of a busy network: a month of
leads ending now (200,000 a day at the default 6,000,000; 20 publishers, 17 buyers, each billed
from a wallet; 60 % sold, 30 % unsold, 10 % returned) with what the pages read beside them:
an attempt per lead, a sale per sold lead, its wallet debit, returns, feedback, the hourly
stats, payments, audit rows and one publisher's events. Then gunicorn (gevent) on that database
and a private Redis, and every GET route of /ops and /portal in the url_map, as an analyst, a
buyer and a publisher user (cookie sessions), `--rounds` times each: p50/p95 per page, a CSV's
first byte (its whole body once). bench/REPORT.md part 44.

    python -m bench.pages [--rows 6000000] [--rounds 20] [--keep] [--reuse DATABASE] [--quick]

Writes bench/out/pages[-TAG].json and .md. `--keep` leaves the database, `--reuse` measures
one kept (same `--rows`) after applying any new migration.
"""

from __future__ import annotations

import argparse
import re
import time
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from pathlib import Path
from tempfile import mkdtemp
from typing import Any
from urllib.parse import urlsplit

import pymysql
import requests

from bench.common import (
    head_rev,
    machine_info,
    markdown_table,
    mysql_kwargs,
    mysql_version,
    percentiles,
    write_json,
    write_md,
)
from bench.stack import ADMIN, base, log
from testkit.servers import create_mysql_db, mysql_admin_url

CHUNK = 250_000
DAYS = 30
SAME_SITE = {"Sec-Fetch-Site": "same-origin"}
PASSWORD = "bench pages password 0123"
TARGET_MS = 100.0
# a lead's attributes from its number `seq` (each table's rows are made from it, never read back)
EXPR = {
    "p": "CONCAT('pub-', MOD(seq, 20))",
    "l": "CONCAT('lead-', seq)",
    "b": "CONCAT('buyer-', MOD(seq, 17))",
    "st": "CASE WHEN MOD(seq DIV 20, 10) < 6 THEN 'sold' WHEN MOD(seq DIV 20, 10) < 9 THEN 'unsold' ELSE 'returned' END",
    "sold": "(MOD(seq DIV 20, 10) < 6 OR MOD(seq DIV 20, 10) = 9)",
    "ret": "(MOD(seq DIV 20, 10) = 9)",
    "pending": "(MOD(seq DIV 20, 10) = 9 AND MOD(seq DIV 200, 400) = 0)",
    "hold": "(MOD(MOD(seq, 20), 4) = 0)",
    "price": "(5 + MOD(seq, 20))",
    "pay": "(0.50 + MOD(seq, 20) / 10)",
}
LOAD = {
    "leads": """INSERT INTO leads (publisher_id, lead_id, status, buyer_id, price, commission, payload,
        received_at, sold_at, settled_at, returned_at, return_reason)
      SELECT {p}, {l}, {st}, IF({sold}, {b}, NULL), IF({sold}, {price}, NULL), IF({sold}, {pay}, NULL),
        CONCAT('{{"email": "c', seq, '@example.com", "phone": "+1555', LPAD(MOD(seq, 10000000), 7, '0'),
               '", "state": "TX", "zip": "73301"}}'),
        {at}, IF({sold}, {at}, NULL), {at}, IF({ret}, {at} + INTERVAL 1 HOUR, NULL), IF({ret}, 'wrong number', NULL)
      FROM seq_{first}_to_{last}""",
    "lead_attempts": """INSERT INTO lead_attempts (publisher_id, lead_id, seq, buyer_id, outcome, ms)
      SELECT {p}, {l}, 0, {b}, CASE WHEN MOD(seq, 100000) = 1 THEN 'unknown'
                                    WHEN {sold} THEN 'accepted' ELSE 'rejected' END, 120
      FROM seq_{first}_to_{last}""",
    "sales": """INSERT INTO sales (publisher_id, lead_id, buyer_id, price, payout, status, sold_at, returned_at,
        return_reason, payout_state, payable_at)
      SELECT {p}, {l}, {b}, {price}, {pay},
        IF({pending}, 'return_pending', IF({ret}, 'returned', 'sold')), {at},
        IF({ret} AND NOT {pending}, {at} + INTERVAL 1 HOUR, NULL), IF({ret}, 'wrong number', NULL),
        CASE WHEN {hold} AND {ret} AND NOT {pending} THEN 'cancelled'
             WHEN {hold} AND {at} > '{held_since}' THEN 'held' ELSE 'payable' END,
        {at} + INTERVAL IF({hold}, 3, 0) DAY
      FROM seq_{first}_to_{last} WHERE {sold}""",
    "lead_stats": """INSERT INTO lead_stats (hour, publisher_id, buyer_id, leads, sold, returned, revenue, payout,
        sales, offers, accepted)
      SELECT DATE_FORMAT({at}, '%Y-%m-%d %H:00:00'), {p}, IF({sold}, {b}, ''), COUNT(*), SUM({sold}), SUM({ret}),
        SUM(IF({sold} AND NOT {ret}, {price}, 0)), SUM(IF({sold} AND NOT {ret}, {pay}, 0)), SUM({sold}), COUNT(*),
        SUM({sold})
      FROM seq_{first}_to_{last} GROUP BY 1, 2, 3
      ON DUPLICATE KEY UPDATE leads = leads + VALUES(leads), sold = sold + VALUES(sold),
        returned = returned + VALUES(returned), revenue = revenue + VALUES(revenue),
        payout = payout + VALUES(payout), sales = sales + VALUES(sales), offers = offers + VALUES(offers),
        accepted = accepted + VALUES(accepted)""",
}
BY_SALE = {  # rows made from the sales, a range of their ids at a time
    "wallet_entries": """INSERT INTO wallet_entries (customer, currency, kind, amount_minor, reference, at)
      SELECT CONCAT(buyer_id, '@example.com'), 'USD', 'sale', -100 * price, CONCAT('sale:', id), sold_at
      FROM sales WHERE id BETWEEN {first} AND {last}
      UNION ALL SELECT CONCAT(buyer_id, '@example.com'), 'USD', 'return', 100 * price, CONCAT('return:', id),
        returned_at FROM sales WHERE id BETWEEN {first} AND {last} AND status = 'returned'""",
    "lead_returns": """INSERT INTO lead_returns (return_id, sale_id, publisher_id, lead_id, buyer_id, reason, status,
        requested_at, decided_at, actor)
      SELECT CONCAT('ret', id), id, publisher_id, lead_id, buyer_id, 'wrong number',
        IF(status = 'returned', 'approved', 'pending'), sold_at + INTERVAL 1 HOUR,
        returned_at, IF(status = 'returned', CONCAT('buyer:', buyer_id), NULL)
      FROM sales WHERE id BETWEEN {first} AND {last} AND status IN ('returned', 'return_pending')""",
    "audit_log": """INSERT INTO audit_log (at, actor, action, entity, entity_id, detail)
      SELECT returned_at, CONCAT('buyer:', buyer_id), 'lead.returned', 'lead', CONCAT(publisher_id, ':', lead_id),
        CONCAT('{{"buyer_id": "', buyer_id, '", "reason": "wrong number"}}')
      FROM sales WHERE id BETWEEN {first} AND {last} AND status = 'returned'""",
    "feedback": """INSERT INTO feedback (buyer_id, feedback_id, sale_id, publisher_id, lead_id, event, created_at)
      SELECT buyer_id, CONCAT('fb', id), id, publisher_id, lead_id, IF(MOD(id, 60) = 0, 'converted', 'contacted'),
        sold_at + INTERVAL 2 HOUR FROM sales WHERE id BETWEEN {first} AND {last} AND MOD(id, 20) = 0""",
    "events": """INSERT INTO events (event_id, type, subject, entity, publisher_id, body, created_at, fanned_out)
      SELECT CONCAT('evt_', id), 'lead.sold', CONCAT(publisher_id, ':', lead_id, ':', buyer_id),
        CONCAT('lead:', publisher_id, ':', lead_id), publisher_id,
        CONCAT('{{"type": "lead.sold", "data": {{"lead_id": "', lead_id, '"}}}}'), sold_at, 1
      FROM sales WHERE id BETWEEN {first} AND {last} AND publisher_id = 'pub-7'""",
}
AFTER = [  # once, after the rest
    """INSERT INTO event_dispatches (event_id, endpoint_id, entity, webhook_id, status, attempts, created_at,
        next_attempt_at, delivered_at)
      SELECT id, 'pub-7-hook', entity, CONCAT('msg_', id), IF(MOD(id, 5000) = 0, 'failed', 'delivered'), 1,
        created_at, created_at, created_at FROM events""",
    """INSERT INTO wallet_entries (customer, currency, kind, amount_minor, reference, at)
      SELECT CONCAT('buyer-', MOD(seq, 17), '@example.com'), 'USD', 'top_up', 500000000, CONCAT('paystack:top-', seq),
        '{start}' + INTERVAL (seq DIV 17) DAY FROM seq_0_to_{topups}""",
    """INSERT INTO payments (provider, reference, amount_minor, currency, customer, status, event_type, received_at,
        credited_at)
      SELECT 'paystack', CONCAT('top-', seq), IF(seq <= {topups}, 500000000, 1000 * MOD(seq, 97)), 'USD',
        IF(seq <= {topups}, CONCAT('buyer-', MOD(seq, 17), '@example.com'), CONCAT('payer', seq, '@example.com')),
        IF(MOD(seq, 400) = 7 AND seq > {topups}, 'unattributed', 'credited'), 'charge.success',
        '{start}' + INTERVAL (seq * {payment_s}) SECOND, '{start}' + INTERVAL (seq * {payment_s}) SECOND
      FROM seq_0_to_{payments}""",
    """INSERT INTO wallets (customer, currency, balance_minor, updated_at, version)
      SELECT customer, currency, SUM(amount_minor), NOW(6), 1 FROM wallet_entries GROUP BY customer, currency
      ON DUPLICATE KEY UPDATE balance_minor = VALUES(balance_minor)""",
]


def load(conn: Any, rows: int, now: datetime) -> float:
    """The month of `rows` leads up to `now`, and what the pages read beside them."""
    started, start = time.perf_counter(), now - timedelta(days=DAYS)
    spread_us = DAYS * 86400 * 10**6 / (rows + 1)
    fmt = {**EXPR, "held_since": now - timedelta(days=3), "start": start, "topups": DAYS * 17 - 1}
    fmt["at"] = f"TIMESTAMPADD(MICROSECOND, FLOOR(seq * {spread_us}), '{start}')"
    payments = max(1000, rows // 60)
    fmt.update(payments=payments, payment_s=DAYS * 86400 / payments)
    with conn.cursor() as cur:
        for first in range(1, rows + 1, CHUNK):
            last = min(first + CHUNK - 1, rows)
            for sql in LOAD.values():
                cur.execute(sql.format(**fmt, first=first, last=last))
            conn.commit()
            log(f"{last:,} leads ({time.perf_counter() - started:.0f} s)")
        cur.execute("SELECT COALESCE(MAX(id), 0) FROM sales")
        top = cur.fetchone()[0]
        for first in range(1, top + 1, CHUNK):
            for sql in BY_SALE.values():
                cur.execute(sql.format(first=first, last=first + CHUNK - 1))
            conn.commit()
        for sql in AFTER:
            cur.execute(sql.format(**fmt))
        conn.commit()
        for table in ("leads", "lead_attempts", "sales", "wallet_entries", "audit_log", "lead_returns", "events"):
            cur.execute(f"ANALYZE TABLE {table}")
            cur.fetchall()
    return time.perf_counter() - started


def lead_seq(rows: int, publisher: int, buyer: int, bucket: int) -> int:
    """The newest lead of `publisher` sold to `buyer` with status bucket `bucket` (EXPR)."""
    return next(s for s in range(rows, 0, -1) if s % 20 == publisher and s % 17 == buyer and s // 20 % 10 == bucket)


def network(http: requests.Session, url: str) -> None:
    """The buyers (billed), publishers and pub-7's event endpoint through the admin API, and an
    analyst, a buyer (buyer-3) and a publisher (pub-7) user, set up through their links."""
    admin = {"Authorization": f"Bearer {ADMIN}"}

    def call(method: str, path: str, body: dict) -> requests.Response:
        resp = http.request(method, url + path, json=body, headers=admin, timeout=30)
        resp.raise_for_status()
        return resp

    for i in range(20):
        call("PUT", f"/v1/admin/publishers/pub-{i}", {"name": f"P{i}", "api_key": f"pk_bench_pages_{i:04d}_key"})
    for i in range(17):
        billing = {"mode": "prepaid", "account": f"buyer-{i}@example.com", "currency": "USD"}
        body = {"name": f"B{i}", "endpoint_url": f"http://127.0.0.1:9/b{i}", "price": "12.50", "priority": i % 3}
        call("PUT", f"/v1/admin/buyers/buyer-{i}", {**body, "billing": billing})
    call("PUT", "/v1/admin/event-endpoints/pub-7-hook", {"url": "http://127.0.0.1:9/hook", "publisher_id": "pub-7"})
    for role, tenant in USERS.items():
        made = call("POST", "/v1/admin/users", {"email": f"{role}@bench.example.com", "role": role, **tenant})
        setup, form = urlsplit(made.json()["setup_url"]).path, {"password": PASSWORD, "password_again": PASSWORD}
        http.post(url + setup, data=form, headers=SAME_SITE, allow_redirects=False, timeout=30).raise_for_status()


USERS = {"analyst": {}, "buyer": {"buyer_id": "buyer-3"}, "publisher": {"publisher_id": "pub-7"}}


def log_in(url: str) -> dict[str, requests.Session]:
    """A logged-in session (its cookie) of each user."""
    sessions = {}
    for role in USERS:
        s, path = requests.Session(), "/ops/login" if role == "analyst" else "/portal/login"
        form = {"email": f"{role}@bench.example.com", "password": PASSWORD}
        resp = s.post(url + path, data=form, headers=SAME_SITE, timeout=30, allow_redirects=False)
        assert resp.status_code == 303 and s.cookies, f"{role} could not log in: {resp.status_code}"
        cookie = next(iter(s.cookies))  # Secure: sent again over plain HTTP, as testkit/ops.py does
        s.cookies.clear()
        s.cookies.set(cookie.name, cookie.value, path=cookie.path)
        sessions[role] = s
    return sessions


def pages(rules: list[tuple[str, str, set[str]]], rows: int, now: datetime) -> list[dict[str, Any]]:
    """Each GET route of /ops and /portal with its ids filled in, and its variants (filters):
    label, path, who asks, whether it is a CSV. A route with an argument not known here is
    listed unmeasured, so a new page shows up in the report."""
    sold, returned = lead_seq(rows, 7, 3, 0), lead_seq(rows, 7, 3, 9)
    day, month = (now - timedelta(days=1)).date().isoformat(), now.strftime("%Y-%m")
    months = ["", f"month={(now.replace(day=1) - timedelta(days=1)).strftime('%Y-%m')}"]  # this one, the last
    since = f"since={(now - timedelta(days=1)).strftime('%Y-%m-%dT%H:%M:%S')}%2B00:00"
    values = {"buyer_id": "buyer-3", "publisher_id": "pub-7", "lead_id": f"lead-{returned}", "instance_number": "0"}
    leads = "|publisher_id=pub-7|buyer_id=buyer-3|status=sold|status=returned|buyer_id=buyer-3&status=sold"
    leads += f"|publisher_id=pub-7&buyer_id=buyer-3|since={day}T00:00:00%2B00:00&until={day}T23:59:59%2B00:00"
    variants = {
        "ops.leads.leads": leads.split("|"),
        "ops.leads.lead": ["publisher_id=pub-7"],
        "ops.reports.reports": ["", "group_by=hour", "group_by=publisher", f"from={now.date() - timedelta(days=29)}"],
        "ops.reports.reports_csv": ["", "group_by=hour"],
        "ops.reports.audit": ["", "entity=lead", "entity=buyer"],
        "ops.buyers.buyer": months,
        "ops.publishers.publisher": months,
        "ops.buyers.buyer_statement_csv": [f"month={month}", months[1]],
        "ops.publishers.publisher_statement_csv": [f"month={month}", months[1]],
        "portal.buyer.sales": ["", "status=returned", since, f"lead_id=lead-{sold}"],
        "portal.buyer.sales_csv": [since, ""],
        "portal.buyer.buyer_statement": months,
        "portal.buyer.statement_csv": months,
        "portal.publisher.leads": ["", "status=sold", f"lead_id=lead-{sold}"],
        "portal.publisher.statement": months,
        "portal.publisher.statement_csv": months,
    }
    out = []
    for rule, endpoint, args in rules:
        who = "buyer" if rule.startswith("/portal/buyer") else "publisher" if rule.startswith("/portal/pub") else None
        who = who or (None if endpoint.endswith(("login", "logged_out")) else "analyst")
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", lambda m: values.get(m.group(1), m.group(0)), rule)
        if endpoint == "portal.buyer.sale":
            path = f"/portal/buyer/sales/pub-7/lead-{returned}"
        for query in variants.get(endpoint, [""]):
            out.append(
                {
                    "page": f"{rule}?{query}" if query else rule,
                    "path": path + (f"?{query}" if query else ""),
                    "who": who,
                    "csv": rule.endswith(".csv"),
                    "missing": sorted(args - set(values)),
                }
            )
    return out


def routes(env: dict[str, str]) -> list[tuple[str, str, set[str]]]:
    """The GET rules of /ops and /portal from the app's url_map: the RQ dashboard's overview
    only (the rest are its scripts' JSON and files), not the set-up link (a token used once)."""
    from webhooks import config, create_app

    found = []
    for rule in create_app(config.load(env)).url_map.iter_rules():
        skip = rule.endpoint.startswith("rq_dashboard") and rule.rule != "/ops/rq/"
        skip = skip or rule.endpoint == "people.setup.setup_form" or "GET" not in (rule.methods or ())
        if rule.rule.startswith(("/ops", "/portal")) and not skip:
            found.append((rule.rule, rule.endpoint, set(rule.arguments) - set(rule.defaults or {})))
    return sorted(found)


def measure(page: dict[str, Any], sessions: dict[str, requests.Session], url: str, rounds: int) -> dict[str, Any]:
    """`rounds` GETs after a warm-up: the whole answer, or a CSV's first byte (then its whole
    body once)."""
    http, samples, status = sessions.get(page["who"] or "") or requests.Session(), [], None
    for i in range(rounds + 1):
        started = time.perf_counter()
        with http.get(url + page["path"], stream=True, timeout=120, allow_redirects=False) as resp:
            _ = next(resp.iter_content(1), b"") if page["csv"] else resp.content
            status = resp.status_code
        if i:
            samples.append((time.perf_counter() - started) * 1000)
    row = {**page, "status": status, **percentiles(samples, (50, 95)), "max": round(max(samples), 1)}
    if page["csv"]:
        started = time.perf_counter()
        body = http.get(url + page["path"], timeout=600).content
        row.update(whole_s=round(time.perf_counter() - started, 2), whole_kb=len(body) // 1024)
    return row


def report(out: dict[str, Any]) -> str:
    m = out["machine"]
    head = (
        f"{out['rows']:,} leads (loaded in {out['load_s']} s) at {out['rev']}, {m['date']}: {m['nproc']} CPUs "
        f"({m['cpu_model']}), MariaDB {m['mariadb']} (buffer pool {m['buffer_pool_mb']} MB), load average "
        f"{m['loadavg_1m_5m_15m']}. {out['rounds']} GETs a page after a warm-up, one at a time; a CSV's first "
        f"byte, its whole body once. **over**: p95 over {TARGET_MS:.0f} ms."
    )
    rows = []
    for p in out["pages"]:
        over = p["p95"] is not None and p["p95"] > TARGET_MS
        whole = f"{p['whole_s']} s, {p['whole_kb']:,} KiB" if "whole_s" in p else ""
        rows.append({**p, "page": f"`{p['page']}`", "over": "**over**" if over else "", "whole": whole})
    columns = (("page", "page"), ("as", "who"), ("status", "status"), ("p50 ms", "p50"), ("p95 ms", "p95"))
    columns += (("max ms", "max"), ("", "over"), ("whole CSV", "whole"))
    return head + "\n\n" + markdown_table(rows, columns) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=6_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="20,000 rows, 2 rounds: that it runs")
    parser.add_argument("--keep", action="store_true", help="leave the database for --reuse")
    parser.add_argument("--reuse", help="a database kept by --keep (the same --rows)")
    parser.add_argument("--tag", default="", help="bench/out/pages-TAG.json")
    args = parser.parse_args()
    rows, rounds = (20_000, 2) if args.quick else (args.rows, args.rounds)
    admin = mysql_admin_url()
    if admin is None:
        raise SystemExit("MariaDB/MySQL is not reachable (FG_TEST_MYSQL): this bench measures the MySQL path")
    now = datetime.now(timezone.utc).replace(microsecond=0, tzinfo=None)
    with ExitStack() as es:
        if args.reuse:
            db_url = f"{admin.rstrip('/')}/{args.reuse}"
        else:
            db_url, drop = create_mysql_db(admin)
            if not args.keep:
                es.callback(drop)
        stack = base(es, Path(mkdtemp(prefix="bench-pages-")), db_url=db_url)
        web = stack.web(es, workers=2)
        conn = pymysql.connect(**mysql_kwargs(db_url))
        load_s = 0.0
        if not args.reuse:
            network(requests.Session(), web.url)
            load_s = load(conn, rows, now)
        listed, sessions = pages(routes(stack.env), rows, now), log_in(web.url)
        log(f"{len(listed)} pages, {rounds} GETs each")
        measured = []
        for page in listed:
            if page["missing"]:
                measured.append({**page, "status": "no value for " + ", ".join(page["missing"]), "p50": None})
                measured[-1].update(p95=None, max=None)
                continue
            measured.append(measure(page, sessions, web.url, rounds))
            log(f"{page['page']}: {measured[-1]['status']}, p50 {measured[-1]['p50']} p95 {measured[-1]['p95']} ms")
        info = machine_info(mariadb=mysql_version(conn), buffer_pool_mb=_pool_mb(conn))
        conn.close()
    name = db_url.rsplit("/", 1)[1]
    out = {"machine": info, "rows": rows, "rounds": rounds, "load_s": round(load_s), "database": name}
    out.update(rev=head_rev(), pages=measured)
    write_json(f"pages{'-' + args.tag if args.tag else ''}.json", out)
    write_md(f"pages{'-' + args.tag if args.tag else ''}.md", report(out))
    print(report(out))
    if args.keep or args.reuse:
        print(f"database {name} kept: --reuse {name}")


def _pool_mb(conn: Any) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT @@innodb_buffer_pool_size")
        return int(cur.fetchone()[0]) // 2**20


if __name__ == "__main__":
    main()
