"""Per-buyer duplicate suppression, the routing trace and lead returns (docs/api.md "dedupe",
"Routing trace", "Lead returns"), against the real Redis, database and HTTP buyers."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from testkit.servers import post_lead_until_answered, wait_until
from webhooks import services
from webhooks.caps import leases, reconcile
from webhooks.caps.dedupe import stored_consumer_keys
from webhooks.formats.consumer import key as normalise
from webhooks.leads.accounting import ledger, returns
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.catalog import load_snapshot
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Publisher

DEDUPE = {"fields": ["email", "phone"], "days": 30}


def consumer(c: int, variant: int) -> dict:
    """Consumer `c` as publishers spell it: e-mail case and spaces, phone formats vary."""
    emails = [f"user{c}@example.com", f"  User{c}@Example.COM ", f"USER{c}@EXAMPLE.COM"]
    phones = [f"+1 (512) 555-{c:04d}", f"512.555.{c:04d}", f"1512555{c:04d}", f"512-555-{c:04d}"]
    return {"email": emails[variant % 3], "phone": phones[variant % 4], "state": "TX"}


def test_normalising_makes_one_consumer_of_every_spelling():
    assert {normalise("email", consumer(7, v)["email"]) for v in range(6)} == {"user7@example.com"}
    assert {normalise("phone", consumer(7, v)["phone"]) for v in range(8)} == {"+15125550007"}
    assert normalise("phone", "+44 20 7946 0958") == "+442079460958"
    assert stored_consumer_keys("acme", ("email",), {"phone": "1"}) == []  # no e-mail: nothing to match on


def _dedupe_buyer(api, buyer_server, mode="accept", **fields):
    dd = buyer_server.add("dd", mode)
    fallback = buyer_server.add("fallback")
    key = api.put_publisher("surge", commission_pct="10")
    api.put_buyer("dd", buyer_server.url("dd"), priority=1, dedupe=DEDUPE, **fields)
    api.put_buyer("fallback", buyer_server.url("fallback"), priority=2)
    api.settle_config()
    return key, dd, fallback


def test_200_concurrent_leads_of_40_consumers_reach_a_dedupe_buyer_once_per_consumer(api, buyer_server):
    key, dd, fallback = _dedupe_buyer(api, buyer_server)
    start = threading.Barrier(50)
    local = threading.local()

    def post(i: int) -> dict:
        if not getattr(local, "waited", False):
            local.waited = True
            start.wait()
        s = getattr(local, "s", None) or api.session()
        local.s = s
        return post_lead_until_answered(s, api.base, key, {"lead_id": f"d{i}", **consumer(i % 40, i // 40)})

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(post, range(200)))
    email = [normalise("email", consumer(i % 40, i // 40)["email"]) for i in range(200)]
    sold = Counter(email[i] for i, a in enumerate(answers) if a["buyer_id"] == "dd")
    assert set(sold.values()) == {1}  # no consumer sold to the buyer twice
    # A failed delivery frees the consumer (docs/api.md): under this load the buyer's connection may
    # fail, or its post run past the deadline (the stub may accept after it, unsold)
    failed = {
        email[i]
        for i, a in enumerate(answers)
        if any(t["buyer_id"] == "dd" and t["outcome"] in ("error", "timeout") for t in a["attempts"])
        or 503 in a["refused"]
    }
    reached = Counter(normalise("email", r["body"]["lead"]["email"]) for r in dd.received)
    assert all(n == 1 or c in failed for c, n in reached.items())  # again only after a failed offer
    # every consumer sold to it once, unless each of that consumer's offers failed
    assert len(sold) + len(failed - set(sold)) == 40
    # the rest cascaded to the next buyer (which, under this load, may fail a connection too)
    assert all(any(t["buyer_id"] == "fallback" for t in a["attempts"]) for a in answers if a["buyer_id"] != "dd")


def test_a_consumer_whose_delivery_failed_is_offered_to_the_buyer_again(api, buyer_server):
    key, dd, fallback = _dedupe_buyer(api, buyer_server, mode="error500")
    assert api.post_lead(key, {"lead_id": "f1", **consumer(1, 0)}).json()["buyer_id"] == "fallback"
    dd.mode = "accept"
    assert api.post_lead(key, {"lead_id": "f2", **consumer(1, 1)}).json()["buyer_id"] == "dd"
    assert len(dd.received) == 2  # offered again after the failure, and bought
    body = api.post_lead(key, {"lead_id": "f3", **consumer(1, 2)}).json()
    assert body["buyer_id"] == "fallback" and len(dd.received) == 2  # now a duplicate: no call


@pytest.mark.e2e  # restarts the run's redis-server empty
def test_after_redis_restarts_empty_no_duplicate_reaches_the_buyer(api, buyer_server, worker, redis_server):
    key, dd, fallback = _dedupe_buyer(api, buyer_server)
    assert api.post_lead(key, {"lead_id": "r1", **consumer(5, 0)}).json()["buyer_id"] == "dd"
    api.wait_settled("r1", "surge")
    redis_server.restart_empty()
    worker.stop()  # the RQ worker quits with its Redis; the fixture starts another for the next test

    def answered():
        resp = api.post_lead(key, {"lead_id": "r2", **consumer(5, 1)})
        return resp.json() if resp.status_code == 200 else None  # 503 while the buyer is rebuilt

    body = wait_until(answered, timeout=45, interval=0.2, what="the rebuild")
    assert body["buyer_id"] == "fallback" and len(dd.received) == 1
    assert api.post_lead(key, {"lead_id": "r3", **consumer(6, 0)}).json()["buyer_id"] == "dd"


def test_the_trace_says_why_each_buyer_was_not_attempted(api, buyer_server, worker):
    for name in ("off", "texas", "blocks", "closed", "full", "dd", "flaky", "taker"):
        buyer_server.add(name, "error500" if name == "flaky" else "accept")
    key = api.put_publisher("surge")
    url = buyer_server.url
    api.put_buyer("off", url("off"), priority=1, active=False)
    api.put_buyer("texas", url("texas"), priority=2, states=["OK"])
    api.put_buyer("blocks", url("blocks"), priority=3, blocked_publishers=["surge"])
    api.put_buyer("closed", url("closed"), priority=4, schedule={})
    api.put_buyer("full", url("full"), priority=5, caps={"daily": 0})
    api.put_buyer("dd", url("dd"), priority=6, dedupe={"fields": ["email"], "days": 1})
    api.put_buyer("flaky", url("flaky"), priority=7)
    api.put_buyer("taker", url("taker"), priority=8)
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "seen", "state": "TX", "email": "a@x.io"}).json()["buyer_id"] == "dd"
    for i in range(3):  # duplicates at dd: flaky fails three times (BREAKER_FAILURES=3), its circuit opens
        assert api.post_lead(key, {"lead_id": f"w{i}", "state": "TX", "email": "a@x.io"}).json()["buyer_id"] == "taker"
    body = api.post_lead(key, {"lead_id": "t1", "state": "TX", "email": "A@x.io"}).json()
    assert body["buyer_id"] == "taker"
    record = api.wait_settled("t1", "surge")
    assert record["skipped"] == [
        {"buyer_id": "off", "reason": "inactive"},
        {"buyer_id": "texas", "reason": "state"},
        {"buyer_id": "blocks", "reason": "blocked_publisher"},
        {"buyer_id": "closed", "reason": "closed"},
        {"buyer_id": "full", "reason": "cap_full:daily"},
        {"buyer_id": "dd", "reason": "duplicate"},
        {"buyer_id": "flaky", "reason": "circuit_open", "circuit": "publisher"},  # its 500s: surge's only
    ]
    page = api.get("/ops").text
    assert "cap_full:daily" in page and "duplicate" in page


def _sell(api, buyer_server, worker_needed=True, **buyer):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge", commission_pct="10")
    api.put_buyer("acme", buyer_server.url("acme"), price="20.00", caps={"daily": 5, "daily_budget": "100.00"}, **buyer)
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "sold-1"}).json()["status"] == "sold"
    api.wait_settled("sold-1", "surge")
    return key, acme


def _balance() -> Decimal:
    with db.connection_context():
        return Publisher.get_by_id("surge").balance


def test_ten_concurrent_returns_of_one_lead_succeed_once(api, buyer_server, worker):
    _sell(api, buyer_server)
    assert _balance() == Decimal("2.00")
    usage = api.get("/v1/admin/buyers/acme").json()["usage"]
    assert (usage["daily"]["used"], usage["daily_budget"]["used"]) == (1, "20.00")
    start = threading.Barrier(10)

    def ret(_):
        start.wait()
        return api.session().post(
            f"{api.base}/v1/admin/leads/sold-1/return?publisher_id=surge",
            json={"reason": "disconnected phone"},
            headers=api.admin,
        )

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(ret, range(10)))
    assert sorted(r.status_code for r in answers) == [200] + [409] * 9
    assert {r.json()["error"]["code"] for r in answers if r.status_code == 409} == {"already_returned"}
    [ok] = [r.json() for r in answers if r.status_code == 200]
    assert ok["status"] == "returned" and ok["return_reason"] == "disconnected phone" and ok["returned_at"]
    assert _balance() == Decimal("0.00")  # the commission, taken back once
    usage = api.get("/v1/admin/buyers/acme").json()["usage"]
    assert (usage["daily"]["used"], usage["daily_budget"]["used"]) == (0, "0.00")  # slot and budget, once


def test_return_refusals(api, buyer_server, worker):
    key, acme = _sell(api, buyer_server, return_window_days=0)
    resp = api.http.post(f"{api.base}/v1/admin/leads/sold-1/return", headers=api.admin)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "return_window_closed"
    acme.mode = "reject"
    assert api.post_lead(key, {"lead_id": "unsold-1"}).json()["status"] == "unsold"
    api.wait_settled("unsold-1", "surge")
    resp = api.http.post(f"{api.base}/v1/admin/leads/unsold-1/return", headers=api.admin)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "not_sold"
    assert api.http.post(f"{api.base}/v1/admin/leads/nope/return", headers=api.admin).status_code == 404
    resp = api.http.post(f"{api.base}/v1/admin/leads/sold-1/return", json={"reason": 5}, headers=api.admin)
    assert resp.status_code == 400


def test_a_return_after_the_sales_day_rolled_over_leaves_the_new_days_cap_alone(api, buyer_server, worker):
    key, _ = _sell(api, buyer_server)  # today's sale: daily used 1
    yesterday = datetime.now(timezone.utc) - timedelta(days=1, hours=1)
    out = Outcome(
        status="sold",
        buyer_id="acme",
        price=Decimal("20.00"),
        sold_at=yesterday,
        lease=leases.Lease("acme", "old-lease", ()),
    )
    pub = PublisherRule(id="surge", active=True, payout_pct=Decimal("10"))
    item = settlement.make_item(
        publisher=pub, lead_id="old-1", outcome=out, payload="{}", received_at=yesterday, request_id=None
    )
    with db.connection_context():
        assert ledger.settle([item]) == 1
    resp = api.http.post(f"{api.base}/v1/admin/leads/old-1/return", headers=api.admin)
    assert resp.status_code == 200 and resp.json()["status"] == "returned"
    usage = api.get("/v1/admin/buyers/acme").json()["usage"]
    assert (usage["daily"]["used"], usage["daily_budget"]["used"]) == (1, "20.00")  # today's sale only


def test_leads_return_cli_returns_a_csv_of_leads(api, app, buyer_server, worker, tmp_path):
    key, _ = _sell(api, buyer_server)
    assert api.post_lead(key, {"lead_id": "sold-2"}).json()["status"] == "sold"
    api.wait_settled("sold-2", "surge")
    csv = tmp_path / "returns.csv"
    csv.write_text("lead_id,publisher_id,reason\nsold-1,surge,bad phone\nsold-2,,\nmissing,surge,\n")
    result = app.test_cli_runner().invoke(args=["leads", "return", str(csv)])
    assert result.exit_code == 1  # one line could not be returned
    assert "2 returned" in result.stdout and "1 not_found" in result.stdout
    assert "missing" in result.stderr
    assert api.get("/v1/admin/leads/sold-2").json()["status"] == "returned"


def test_leads_return_cli_checks_the_reason_as_the_admin_api_does(api, app, buyer_server, worker, tmp_path):
    _sell(api, buyer_server)
    csv = tmp_path / "returns.csv"
    csv.write_text(f"lead_id,publisher_id,reason\nsold-1,surge,{'x' * (returns.MAX_REASON + 1)}\n")
    result = app.test_cli_runner().invoke(args=["leads", "return", str(csv)])
    assert result.exit_code == 1 and "1 invalid_return" in result.stdout, result.output
    assert api.get("/v1/admin/leads/sold-1").json()["status"] == "sold"  # nothing returned
    csv.write_text("lead_id,publisher_id,reason\nsold-1,surge,bad phone\n")  # then the right value
    assert app.test_cli_runner().invoke(args=["leads", "return", str(csv)]).exit_code == 0
    assert api.get("/v1/admin/leads/sold-1").json()["status"] == "returned"


@pytest.mark.parametrize(
    "dedupe",
    [
        {"fields": ["fax"]},
        {"fields": []},
        {"fields": ["email"], "days": 0},
        {"fields": ["email", "email"]},
        ["email"],
        {"fields": ["email"], "x": 1},
    ],
)
def test_bad_dedupe_settings_are_refused(api, dedupe):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/b",
        headers=api.admin,
        json={"name": "B", "endpoint_url": "http://127.0.0.1:9/", "price": "1.00", "dedupe": dedupe},
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_buyer"
    assert "dedupe" in resp.json()["error"]["message"]


def test_dedupe_and_return_window_are_stored_and_shown(api):
    body = {
        "name": "B",
        "endpoint_url": "http://127.0.0.1:9/",
        "price": "1.00",
        "dedupe": DEDUPE,
        "return_window_days": 14,
    }
    assert api.http.put(f"{api.base}/v1/admin/buyers/b", json=body, headers=api.admin).status_code == 200
    got = api.get("/v1/admin/buyers/b").json()
    assert got["dedupe"] == DEDUPE and got["return_window_days"] == 14


def test_a_consumer_is_remembered_for_the_lease_only_until_the_sale_is_confirmed(api, app, buyer_server):
    """A lease that never finishes (its process died) frees the consumer when it expires; a
    confirmed sale remembers it for the buyer's dedupe days."""
    key, dd, fallback = _dedupe_buyer(api, buyer_server)
    r = services.of(app).store.redis
    assert api.post_lead(key, {"lead_id": "m1", **consumer(3, 0)}).json()["buyer_id"] == "dd"
    [email_key] = list(r.keys("fg:{b:dd}:dedupe:email:*"))
    assert r.pttl(email_key) > 29 * 86_400_000  # confirmed: 30 days
    with db.connection_context():
        [rule] = [b for b in load_snapshot(None).buyers if b.id == "dd"]
    store = services.of(app).store
    keys_ = stored_consumer_keys("dd", rule.dedupe_fields, consumer(4, 0))
    held = leases.reserve(
        store, rule, datetime.now(timezone.utc), lease_ttl_ms=5_000, probe_ttl_ms=5_000, consumer=keys_
    )
    assert held.status == "ok" and all(0 < r.pttl(k) <= 5_000 for k in keys_)  # as long as the lease


def test_a_ping_buyer_is_not_pinged_for_a_consumer_it_bought(api, buyer_server):
    buyer_server.add("pp")
    ping = buyer_server.add("pp/ping")
    ping.mode, ping.reply = "reply", (200, b'{"price": "9.00"}', "application/json")
    buyer_server.add("fallback")
    key = api.put_publisher("surge")
    api.put_buyer(
        "pp",
        buyer_server.url("pp"),
        priority=1,
        dedupe={"fields": ["email"], "days": 1},
        ping={"url": buyer_server.url("pp/ping"), "bid": "price"},
    )
    api.put_buyer("fallback", buyer_server.url("fallback"), priority=2)
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "q1", "email": "a@x.io"}).json()["buyer_id"] == "pp"
    pings = len(ping.received)
    body = api.post_lead(key, {"lead_id": "q2", "email": "A@x.io"}).json()
    assert body["buyer_id"] == "fallback" and len(ping.received) == pings  # not even pinged


def test_a_return_during_a_reconciliation_leaves_the_slot_to_it(api, app, buyer_server, worker):
    _sell(api, buyer_server)
    r = services.of(app).store.redis
    r.set("fg:{b:acme}:reconciling", "1", px=10_000)  # a reconciliation of acme is under way
    resp = api.http.post(f"{api.base}/v1/admin/leads/sold-1/return", headers=api.admin)
    assert resp.status_code == 200
    assert api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == 1  # left to it
    r.delete("fg:{b:acme}:reconciling")
    with db.connection_context():
        [rule] = [b for b in load_snapshot(None).buyers if b.id == "acme"]
    reconcile.reconcile_buyer(services.of(app).store, r, rule)
    assert api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == 0  # counted once
