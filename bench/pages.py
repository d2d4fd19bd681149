"""Every console (/ops) and portal (/portal) page at a busy network's ledger: a month of leads
ending now (200,000 a day at 6,000,000; 20 publishers, 17 buyers billed from wallets; 60 % sold,
30 % unsold, 10 % returned), with what the pages read beside them (attempts, sales, the wallet
journal, returns, feedback, hourly stats, payments, audit rows, events). gunicorn on it; every
GET route of /ops and /portal in the url_map, as an analyst, a buyer and a publisher user,
`--rounds` times: p50/p95 a page (a CSV's first byte; its whole body once). REPORT.md part 44.

    python -m bench.pages [--rows 6000000] [--rounds 20] [--keep] [--reuse DATABASE] [--quick]

`--keep` leaves the database; `--reuse` measures a kept one (same `--rows`) after any new
migration. Writes bench/out/pages[-TAG].json and .md.
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

from bench import common
from bench.stack import ADMIN, base, log
from testkit.servers import create_mysql_db, mysql_admin_url

CHUNK = 250_000
DAYS = 30
SAME_SITE = {"Sec-Fetch-Site": "same-origin"}
PASSWORD = "bench pages password 0123"
TARGET_MS = 100.0
CSV_ROUNDS = 3  # a CSV of a month takes seconds whole
CSV_CAP = 32 << 20  # bytes of a CSV read at most
SQL = (Path(__file__).parent / "pages.sql").read_text()  # its sections: [expr], [leads], [sales], [once]


def section(name: str) -> str:
    return SQL.split(f"-- [{name}]", 1)[1].split("\n-- [", 1)[0].split("\n", 1)[1]


def statements(name: str) -> list[str]:
    return [sql.strip() for sql in section(name).split(";\n") if sql.strip()]


EXPR = dict(line.split(": ", 1) for line in section("expr").splitlines())


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
            for sql in statements("leads"):
                cur.execute(sql.format(**fmt, first=first, last=last))
            conn.commit()
            log(f"{last:,} leads ({time.perf_counter() - started:.0f} s)")
        cur.execute("SELECT COALESCE(MAX(id), 0) FROM sales")
        top = cur.fetchone()[0]
        for first in range(1, top + 1, CHUNK):
            for sql in statements("sales"):
                cur.execute(sql.format(first=first, last=first + CHUNK - 1))
            conn.commit()
            log(f"{min(first + CHUNK - 1, top):,} sales' rows ({time.perf_counter() - started:.0f} s)")
        for sql in statements("once"):
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
    call("PUT", "/v1/admin/suppression-lists/dnc", {"field": "email", "hash": "sha256"})
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
    hour = f"since={(now - timedelta(hours=1)).strftime('%Y-%m-%dT%H:%M:%S')}%2B00:00"
    values = {"buyer_id": "buyer-3", "publisher_id": "pub-7", "lead_id": f"lead-{returned}", "instance_number": "0"}
    values.update(endpoint_id="pub-7-hook", list_id="dnc")  # another argument: "no value for" it
    leads = "|publisher_id=pub-7|buyer_id=buyer-3|status=sold|status=returned|buyer_id=buyer-3&status=sold"
    leads += f"|publisher_id=pub-7&buyer_id=buyer-3|since={day}T00:00:00%2B00:00&until={day}T23:59:59%2B00:00"
    leads += f"|q=lead-{sold}|q=c{sold}%40example.com"  # a lookup by id, by e-mail (no digest loaded: none found)
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
        "ops.leads.leads_csv": [hour, f"buyer_id=buyer-3&status=returned&{since}"],  # every lead: hours
        "portal.buyer.buyer_statement": months,
        "portal.buyer.statement_csv": months,
        "portal.publisher.leads": ["", "status=sold", f"lead_id=lead-{sold}"],
        "portal.publisher.statement": months,
        "portal.publisher.statement_csv": months,
    }
    out = []
    for rule, endpoint, args in rules:
        who = "publisher" if rule.startswith("/portal/pub") else "buyer" if rule.startswith("/portal") else None
        who = who or (None if endpoint.endswith(("login", "logged_out")) else "analyst")
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", lambda m: values.get(m.group(1), m.group(0)), rule)
        if endpoint == "portal.buyer.sale":
            path = f"/portal/buyer/sales/pub-7/lead-{returned}"
        for q in variants.get(endpoint, [""]):
            page = dict(page=f"{rule}?{q}" if q else rule, path=path + (f"?{q}" if q else ""), who=who)
            out.append({**page, "csv": rule.endswith(".csv"), "missing": sorted(args - set(values))})
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
    """`rounds` GETs after a warm-up, each read whole; a CSV's time is to its first byte (its
    whole body timed apart), CSV_ROUNDS of them: a CSV left unread keeps the server writing it,
    which the pages after it would pay for."""
    http, samples, whole, status = sessions.get(page["who"] or "") or requests.Session(), [], [], None
    for i in range(min(rounds, CSV_ROUNDS) + 1 if page["csv"] else rounds + 1):
        started = time.perf_counter()
        with http.get(url + page["path"], stream=True, timeout=600, allow_redirects=False) as resp:
            chunks = resp.iter_content(65536)
            first = next(chunks, b"") if page["csv"] else b""
            first_ms = (time.perf_counter() - started) * 1000
            size = len(first)
            for chunk in chunks:  # a CSV of every lead (millions) is left after CSV_CAP bytes
                size += len(chunk)
                if size > CSV_CAP:
                    break
            status = resp.status_code
        if i:
            samples.append(first_ms if page["csv"] else (time.perf_counter() - started) * 1000)
            whole.append(time.perf_counter() - started)
    row = {**page, "status": status, **common.percentiles(samples, (50, 95)), "max": round(max(samples), 1)}
    if page["csv"]:
        row.update(whole_s=round(sorted(whole)[len(whole) // 2], 2), whole_kb=size // 1024)
    return row


def report(out: dict[str, Any]) -> str:
    m = out["machine"]
    head = (
        f"{out['rows']:,} leads (loaded in {out['load_s']} s) at {out['rev']}, {m['date']}: {m['nproc']} CPUs "
        f"({m['cpu_model']}), MariaDB {m['mariadb']} (buffer pool {m['buffer_pool_mb']} MB), load average "
        f"{m['loadavg_1m_5m_15m']}. {out['rounds']} GETs a page after a warm-up, one at a time, each read whole; a "
        f"CSV's first byte ({CSV_ROUNDS} GETs; the median of the whole). **over**: p95 over {TARGET_MS:.0f} ms."
    )
    rows = []
    for p in out["pages"]:
        over = p["p95"] is not None and p["p95"] > TARGET_MS
        whole = f"{p['whole_s']} s, {p['whole_kb']:,} KiB" if "whole_s" in p else ""
        rows.append({**p, "page": f"`{p['page']}`", "over": "**over**" if over else "", "whole": whole})
    columns = (("page", "page"), ("as", "who"), ("status", "status"), ("p50 ms", "p50"), ("p95 ms", "p95"))
    columns += (("max ms", "max"), ("", "over"), ("whole CSV", "whole"))
    return head + "\n\n" + common.markdown_table(rows, columns) + "\n"


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
        stack = base(es, Path(mkdtemp(prefix="bench-pages-")), db=db_url)
        web = stack.web(es, workers=2)
        conn = pymysql.connect(**common.mysql_kwargs(db_url))
        listed, load_s = pages(routes(stack.env), rows, now), 0.0  # the app's code as it is now
        if not args.reuse:
            network(requests.Session(), web.url)
            load_s = load(conn, rows, now)
        sessions = log_in(web.url)
        log(f"{len(listed)} pages, {rounds} GETs each")
        measured = []
        for page in listed:
            if page["missing"]:
                measured.append({**page, "status": "no value for " + ", ".join(page["missing"]), "p50": None})
                measured[-1].update(p95=None, max=None)
                continue
            measured.append(measure(page, sessions, web.url, rounds))
            log(f"{page['page']}: {measured[-1]['status']}, p50 {measured[-1]['p50']} p95 {measured[-1]['p95']} ms")
        info = common.machine_info(mariadb=common.mysql_version(conn), buffer_pool_mb=_pool_mb(conn))
        conn.close()
    name = db_url.rsplit("/", 1)[1]
    out = {"machine": info, "rows": rows, "rounds": rounds, "load_s": round(load_s), "database": name}
    out.update(rev=common.head_rev(), pages=measured)
    common.write_json(f"pages{'-' + args.tag if args.tag else ''}.json", out)
    common.write_md(f"pages{'-' + args.tag if args.tag else ''}.md", report(out))
    print(report(out))
    if args.keep or args.reuse:
        print(f"database {name} kept: --reuse {name}")


def _pool_mb(conn: Any) -> int:
    with conn.cursor() as cur:
        return cur.execute("SELECT @@innodb_buffer_pool_size") and int(cur.fetchone()[0]) // 2**20


if __name__ == "__main__":
    main()
