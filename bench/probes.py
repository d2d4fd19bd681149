"""bench/versus.py's two probes, each against Floodgate and the plain seed alike (what they
send and what counts as right: versus.py's docstring): (a) one lead id sent three times at
once, how many posts its buyer got; (b) a payment whose first delivery fails after its
duplicates were answered, whether it reaches the ledger."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pymysql
import requests

from bench.common import mysql_kwargs
from bench.stack import API_KEY
from testkit.payments import encode, payload, signed_headers
from testkit.servers import BuyerServer, wait_until


def probe_leads(url: str, buyers: BuyerServer, name: str) -> dict:
    """30 lead ids × 3 at once to buyer `name` of `buyers`: the posts it received."""
    buyer = buyers.buyers[name]
    bodies = [
        {"lead_id": f"probe-{name}-{i}", "state": "TX", "email": "ada@example.com", "phone": "+15125550100"}
        for i in range(30)
        for _ in range(3)
    ]
    go = threading.Barrier(len(bodies))

    def send(body: dict) -> int:
        go.wait()
        resp = requests.post(url + "/v1/leads", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
        return resp.status_code

    with ThreadPoolExecutor(len(bodies)) as pool:
        statuses = list(pool.map(send, bodies))
    time.sleep(0.5)
    posted = [r["body"]["lead_id"] for r in buyer.arrived]
    return {
        "requests": len(bodies),
        "answers": {str(s): statuses.count(s) for s in sorted(set(statuses))},
        "buyer_posts": len(posted),
        "distinct_leads_posted": len(set(posted)),
        "leads_posted_more_than_once": sum(1 for lead in set(posted) if posted.count(lead) > 1),
    }


def probe_payment(url: str, db_url: str, reference: str) -> dict:
    """Probe (b) against the web app at `url`, whose database is `db_url` (see the docstring)."""
    kw = mysql_kwargs(db_url)
    dbname = kw.pop("database")
    raw = encode(payload("paystack", reference, 123_456, "NGN", "probe@x.io"))
    headers = {"Content-Type": "application/json", **signed_headers("paystack", raw)}

    def deliver() -> dict:
        try:
            resp = requests.post(url + "/v1/webhooks/paystack", data=raw, headers=headers, timeout=30)
        except requests.RequestException as exc:
            return {"status": None, "body": type(exc).__name__}
        return {"status": resp.status_code, "body": resp.text[:120]}

    locker = pymysql.connect(database=dbname, **kw)
    admin = pymysql.connect(**kw)
    with locker.cursor() as cur:
        cur.execute("LOCK TABLES payments WRITE")
    answers: list[dict] = []
    first: list[dict] = []
    t = threading.Thread(target=lambda: first.append(deliver()))
    t.start()

    def waiting() -> list[int]:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT id FROM information_schema.processlist WHERE db = %s AND state LIKE %s",
                (dbname, "%lock%"),
            )
            return [row[0] for row in cur.fetchall()]

    try:
        blocked = bool(wait_until(waiting, timeout=5, what="the first delivery waiting on the lock"))
    except AssertionError:
        blocked = False
    with ThreadPoolExecutor(4) as pool:
        duplicates = list(pool.map(lambda _: deliver(), range(4)))
    with admin.cursor() as cur:  # the database goes away for the arm: every connection cut
        cur.execute(
            "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> %s", (dbname, locker.thread_id())
        )
        for (conn_id,) in cur.fetchall():
            try:
                cur.execute(f"KILL CONNECTION {int(conn_id)}")
            except pymysql.MySQLError:
                pass
    t.join(30)
    with locker.cursor() as cur:
        cur.execute("UNLOCK TABLES")
    locker.close()
    answers = first + duplicates
    retries = []
    if not any(a["status"] and 200 <= a["status"] < 300 for a in answers):
        for _ in range(
            30
        ):  # the provider retries while it has no 2xx (here 30 s; Paystack: 72 hours, docs/payments.md)
            time.sleep(1)
            retries.append(deliver())
            if retries[-1]["status"] and 200 <= retries[-1]["status"] < 300:
                break
    time.sleep(1)
    with admin.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM `{dbname}`.payments WHERE reference = %s", (reference,))
        rows = cur.fetchone()[0]
    admin.close()
    acked = any(a["status"] and 200 <= a["status"] < 300 for a in answers + retries)
    return {
        "first_waited_on_the_lock": blocked,
        "first": first[0] if first else None,
        "duplicates": duplicates,
        "retries": retries,
        "ledger_rows": rows,
        "outcome": "credited"
        if rows == 1
        else ("lost: acknowledged, not in the ledger" if acked else "not credited, provider still retrying"),
    }
