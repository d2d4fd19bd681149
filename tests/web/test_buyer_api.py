"""Buyer keys and the buyer API (docs/api.md "Sales", docs/buyers.md "The buyer API"), against
the real Redis, database and app: a key issued, used and rotated; a buyer reaching only its own
sales, another's answered exactly as an unknown lead; returns under the policy's limits and
racing an operator's; hostile bodies and queries; wrong keys counted per address."""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from webhooks.caps import leases
from webhooks.leads.accounting import buyer_sales, ledger
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db, is_mysql
from webhooks.storage.records.models import AuditLog, Buyer, Event, LeadReturn, Publisher, Sale


def _sold(lead_id: str, buyer_id: str, sold_at: datetime | None = None, price: str = "20.00") -> None:
    """A lead of publisher `surge` settled as sold to `buyer_id` (as routing would settle it)."""
    at = sold_at or datetime.now(timezone.utc)
    outcome = Outcome(
        status="sold", buyer_id=buyer_id, price=Decimal(price), sold_at=at, lease=leases.Lease(buyer_id, "l", ())
    )
    publisher = PublisherRule(id="surge", active=True, payout_pct=Decimal("10"))
    item = settlement.make_item(
        publisher=publisher,
        lead_id=lead_id,
        outcome=outcome,
        payload='{"email": "a@x.io"}',
        received_at=at,
        request_id=None,
    )
    with db.connection_context():
        assert ledger.settle([item]) == 1


def _unsold(lead_id: str) -> None:
    at = datetime.now(timezone.utc)
    publisher = PublisherRule(id="surge", active=True, payout_pct=Decimal("10"))
    item = settlement.make_item(
        publisher=publisher,
        lead_id=lead_id,
        outcome=Outcome(status="unsold"),
        payload="{}",
        received_at=at,
        request_id=None,
    )
    with db.connection_context():
        assert ledger.settle([item]) == 1


def _buyers(api, buyer_server, *names: str, **fields) -> None:
    api.put_publisher("surge", commission_pct="10")
    for name in names:
        buyer_server.add(name)
        api.put_buyer(name, buyer_server.url(name), price="20.00", **fields)


def _key(api, buyer_id: str) -> str:
    resp = api.http.post(f"{api.base}/v1/admin/buyers/{buyer_id}/api-key", headers=api.admin)
    assert resp.status_code == 201, resp.text
    return resp.json()["api_key"]


def _as(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def _leads(api, key: str, **params):
    return api.http.get(f"{api.base}/v1/buyer/leads", params=params, headers=_as(key))


def _return(api, key: str, body, **kw):
    return api.http.post(f"{api.base}/v1/buyer/returns", json=body, headers=_as(key), **kw)


def _balance() -> Decimal:
    with db.connection_context():
        return Publisher.get_by_id("surge").balance


def test_a_key_is_issued_used_and_rotated_and_the_old_one_stops_at_once(api, buyer_server):
    _buyers(api, buyer_server, "acme")
    _sold("k1", "acme")
    resp = api.http.post(f"{api.base}/v1/admin/buyers/acme/api-key", headers=api.admin)
    assert resp.status_code == 201 and resp.headers["Cache-Control"] == "no-store"
    first = resp.json()["api_key"]
    assert first.startswith("bk_") and len(first) == 46 and set(resp.json()) == {"api_key"}
    page = _leads(api, first)
    assert page.status_code == 200, page.text
    assert [i["lead_id"] for i in page.json()["items"]] == ["k1"]

    second = _key(api, "acme")
    assert second != first
    old = _leads(api, first)
    assert old.status_code == 401 and old.json()["error"]["code"] == "unauthorized"
    assert _leads(api, second).status_code == 200
    with db.connection_context():  # only a hash is kept, and the audit log holds neither
        assert Buyer.get_by_id("acme").api_key_hash == hashlib.sha256(second.encode()).hexdigest()
        rows = list(AuditLog.select().where(AuditLog.entity == "buyer", AuditLog.action.startswith("buyer.api_key")))
    assert [r.action for r in rows] == ["buyer.api_key_issued", "buyer.api_key_rotated"]
    assert all(k not in (r.detail or "") for r in rows for k in (first, second, first[3:20], second[3:20]))
    # a PUT of the buyer (as GET shows it) keeps its key
    api.put_buyer("acme", buyer_server.url("acme"), price="25.00")
    assert _leads(api, second).status_code == 200


def test_no_key_a_wrong_key_and_an_inactive_or_deleted_buyers_key_are_401(api, buyer_server):
    _buyers(api, buyer_server, "acme", "gone")
    key, gone = _key(api, "acme"), _key(api, "gone")
    for headers in ({}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer "}):
        resp = api.http.get(f"{api.base}/v1/buyer/leads", headers=headers)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized", resp.text
        assert "missing buyer API key" in resp.json()["error"]["message"]
    for wrong in (key[:-1] + ("A" if key[-1] != "A" else "B"), "bk_" + "x" * 5000, "pk_test_surge_0123456789", "é"):
        resp = _leads(api, wrong)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized", resp.text
    api.put_buyer("acme", buyer_server.url("acme"), price="20.00", active=False)
    assert _leads(api, key).status_code == 401
    assert _return(api, key, {"lead_id": "x", "publisher_id": "surge"}).status_code == 401
    api.put_buyer("acme", buyer_server.url("acme"), price="20.00", active=True)
    assert _leads(api, key).status_code == 200  # paused, not revoked
    assert api.http.delete(f"{api.base}/v1/admin/buyers/gone", headers=api.admin).status_code == 204
    assert _leads(api, gone).status_code == 401
    api.put_buyer("gone", buyer_server.url("gone"), price="20.00")  # put back: its old key stays dead
    assert _leads(api, gone).status_code == 401
    missing = api.http.post(f"{api.base}/v1/admin/buyers/nobody/api-key", headers=api.admin)
    assert missing.status_code == 404
    no_admin = api.http.post(f"{api.base}/v1/admin/buyers/acme/api-key", headers=_as(key))
    assert no_admin.status_code == 401  # a buyer key is no admin token


def test_a_buyer_reaches_only_its_own_sales_and_another_buyers_lead_is_an_unknown_one(api, buyer_server, worker):
    _buyers(api, buyer_server, "alpha", "bravo")
    _sold("a1", "alpha")
    _sold("b1", "bravo")
    _unsold("u1")
    _sold("both", "bravo")
    with db.connection_context():  # a lead with a sale to each (a shared lead)
        mine = Sale.get(Sale.lead_id == "both")
        Sale.insert(
            publisher_id="surge",
            lead_id="both",
            buyer_id="alpha",
            price=Decimal("7.00"),
            status="sold",
            sold_at=mine.sold_at,
        ).execute()
    alpha, bravo = _key(api, "alpha"), _key(api, "bravo")
    listed = _leads(api, alpha).json()["items"]
    assert sorted(i["lead_id"] for i in listed) == ["a1", "both"]
    assert {i["price"] for i in listed if i["lead_id"] == "both"} == {"7.00"}  # its own sale, not bravo's
    for item in listed:
        assert set(item) == {
            "lead_id", "publisher_id", "price", "status", "sold_at", "returned_at", "return_reason", "return_id"
        }  # fmt: skip

    answers = [
        _return(api, alpha, {"lead_id": lead, "publisher_id": publisher, "reason": "bad"})
        for lead, publisher in (("b1", "surge"), ("nope", "surge"), ("u1", "surge"), ("a1", "other"))
    ]
    assert {r.status_code for r in answers} == {404}
    assert len({r.content for r in answers}) == 1, [r.text for r in answers]  # one body: no oracle
    assert answers[0].json()["error"]["code"] == "not_found"
    with db.connection_context():
        assert Sale.get(Sale.lead_id == "b1").status == "sold"

    done = _return(api, alpha, {"lead_id": "both", "publisher_id": "surge", "reason": "bad"})
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["status"] == "returned" and body["price"] == "7.00" and body["return_id"].startswith("ret_")
    assert set(body) == set(listed[0])  # the sale as the list shows it: nothing of bravo's
    with db.connection_context():
        statuses = {s.buyer_id: s.status for s in Sale.select().where(Sale.lead_id == "both")}
        ret = LeadReturn.get(LeadReturn.return_id == body["return_id"])
        audit = AuditLog.get(AuditLog.action == "lead.returned", AuditLog.entity_id == "surge:both")
    assert statuses == {"alpha": "returned", "bravo": "sold"}
    assert ret.actor == "buyer:alpha" and audit.actor == "buyer:alpha"
    assert [i["lead_id"] for i in _leads(api, bravo).json()["items"]] == ["both", "b1"]


def test_buyer_returns_hold_to_the_policy_at_its_limits(api, buyer_server, worker):
    """50 % over 14 days with listed reasons and a 2-day window: one return of two sales of the
    period, not a second; a sale three days old is past the window; a reason not listed, 400."""
    policy = {"window_days": 2, "max_pct": 50, "period_days": 14, "reasons": ["bad_phone", "duplicate"]}
    _buyers(api, buyer_server, "acme", returns=policy)
    now = datetime.now(timezone.utc)
    _sold("p1", "acme", now - timedelta(hours=1))
    _sold("p2", "acme", now - timedelta(hours=1))
    _sold("old", "acme", now - timedelta(days=3))
    key = _key(api, "acme")

    def ret(lead: str, reason: str | None = "bad_phone"):
        return _return(api, key, {"lead_id": lead, "publisher_id": "surge", "reason": reason})

    for reason in ("not_interested", None, "Bad_Phone"):
        resp = ret("p1", reason)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_return", resp.text
    resp = ret("old")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "return_window_closed", resp.text
    assert ret("p1").status_code == 200  # 1 of 3 sold in the period: at 50 % (3 sales, 1 return)
    resp = ret("p2")  # 2 of 3: past 50 %
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "return_limit", resp.text
    resp = ret("p1")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "already_returned"
    items = {i["lead_id"]: i for i in _leads(api, key).json()["items"]}
    assert items["p1"]["status"] == "returned" and items["p1"]["return_reason"] == "bad_phone"
    assert items["p2"]["status"] == "sold" and items["p2"]["return_id"] is None


def test_a_reviewed_buyers_return_waits_as_the_admin_one_does(api, buyer_server, worker):
    _buyers(api, buyer_server, "acme", returns={"review": "manual"})
    _sold("m1", "acme")
    key = _key(api, "acme")
    resp = _return(api, key, {"lead_id": "m1", "publisher_id": "surge", "reason": "wrong number"})
    assert resp.status_code == 202, resp.text
    pending = resp.json()
    assert pending["status"] == "return_pending" and set(pending) == {"return_id", "status"}
    [item] = _leads(api, key, status="return_pending").json()["items"]
    assert item["lead_id"] == "m1" and item["return_id"] == pending["return_id"]
    assert _balance() == Decimal("2.00")  # nothing moved before the review
    with db.connection_context():
        requested = AuditLog.get(AuditLog.action == "return.requested")
    assert requested.actor == "buyer:acme"
    approved = api.http.post(f"{api.base}/v1/admin/returns/{pending['return_id']}/approve", headers=api.admin)
    assert approved.status_code == 200
    assert _balance() == Decimal("0.00")
    assert _leads(api, key, status="returned").json()["items"][0]["lead_id"] == "m1"


def test_a_buyer_and_an_operator_returning_one_sale_at_once_have_its_effects_once(api, buyer_server, worker):
    _buyers(api, buyer_server, "acme")
    key = _key(api, "acme")
    for round_ in range(5):
        lead = f"race{round_}"
        _sold(lead, "acme")
        before = _balance()
        start = threading.Barrier(4)

        def go(who: int, lead: str = lead, start: threading.Barrier = start):
            s = api.session()
            start.wait()
            if who % 2:
                return s.post(f"{api.base}/v1/admin/leads/{lead}/return?publisher_id=surge", json={}, headers=api.admin)
            return s.post(
                f"{api.base}/v1/buyer/returns", json={"lead_id": lead, "publisher_id": "surge"}, headers=_as(key)
            )

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(go, range(4)))
        assert sorted(r.status_code for r in answers) == [200, 409, 409, 409], [r.text for r in answers]
        assert {r.json()["error"]["code"] for r in answers if r.status_code == 409} == {"already_returned"}
        assert _balance() == before - Decimal("2.00")  # the payout taken back once
        with db.connection_context():
            assert LeadReturn.select().where(LeadReturn.lead_id == lead).count() == 1
            events = Event.select().where(Event.entity == f"surge:{lead}", Event.type == "lead.returned").count()
        assert events == 1


def test_the_list_is_newest_first_under_a_cursor_and_filters(api, buyer_server):
    _buyers(api, buyer_server, "acme", "other")
    now = datetime.now(timezone.utc)
    for i in range(5):
        _sold(f"s{i}", "acme", now - timedelta(hours=10 - i))
    _sold("theirs", "other", now)
    key = _key(api, "acme")
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = _leads(api, key, **params).json()
        seen.append([i["lead_id"] for i in page["items"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [["s4", "s3"], ["s2", "s1"], ["s0"]]
    since = (now - timedelta(hours=8)).isoformat()  # s2's own instant: inclusive
    assert [i["lead_id"] for i in _leads(api, key, since=since).json()["items"]] == ["s4", "s3", "s2"]
    assert _leads(api, key, status="returned").json()["items"] == []
    assert _leads(api, key, status="", since="").json()["items"][0]["lead_id"] == "s4"  # empty: no filter


@pytest.mark.parametrize(
    "query",
    [
        {"status": "unsold"},
        {"status": "x" * 5000},
        {"since": "yesterday"},
        {"since": "2026-12-01T00:00:00"},  # no offset
        {"limit": "0"},
        {"limit": "501"},
        {"limit": "١"},
        {"cursor": "not-a-cursor"},
        {"cursor": "WzFd"},  # [1]: base64 of JSON, not ours
        {"cursor": "x" * 10_000},
    ],
)
def test_a_query_the_list_cannot_take_is_a_clean_400(api, buyer_server, query):
    _buyers(api, buyer_server, "acme")
    resp = _leads(api, _key(api, "acme"), **query)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_query", resp.text


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"[]",
        b'"lead"',
        b"null",
        b'{"lead_id": "a1", "lead_id": "a1", "publisher_id": "surge"}',  # duplicate key
        b'{"lead_id": NaN, "publisher_id": "surge"}',
        b"\xff\xfe{}",
        b"[" * 100 + b"]" * 100,
        json.dumps({"lead_id": 5, "publisher_id": "surge"}).encode(),
        json.dumps({"lead_id": ["a1"], "publisher_id": "surge"}).encode(),
        json.dumps({"lead_id": "a1"}).encode(),
        json.dumps({"publisher_id": "surge"}).encode(),
        json.dumps({"lead_id": "a1", "publisher_id": None}).encode(),
        json.dumps({"lead_id": "x" * 10_240, "publisher_id": "surge"}).encode(),
        json.dumps({"lead_id": "lëad-☃", "publisher_id": "surge"}).encode(),
        json.dumps({"lead_id": "a1\n", "publisher_id": "surge"}).encode(),
        json.dumps({"lead_id": "a1", "publisher_id": "surge", "reason": 5}).encode(),
        json.dumps({"lead_id": "a1", "publisher_id": "surge", "reason": "r" * 501}).encode(),
        json.dumps({"lead_id": "a1", "publisher_id": "surge", "buyer_id": "bravo"}).encode(),
    ],
)
def test_a_hostile_return_body_is_a_clean_400_and_changes_nothing(api, buyer_server, raw):
    _buyers(api, buyer_server, "acme")
    _sold("a1", "acme")
    key = _key(api, "acme")
    resp = api.http.post(
        f"{api.base}/v1/buyer/returns", data=raw, headers={**_as(key), "Content-Type": "application/json"}
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] in ("invalid_json", "invalid_return")
    with db.connection_context():
        assert Sale.get(Sale.lead_id == "a1").status == "sold"


def test_a_body_over_the_cap_is_413_unread(api, buyer_server):
    _buyers(api, buyer_server, "acme")
    key = _key(api, "acme")
    huge = json.dumps({"lead_id": "a1", "publisher_id": "surge", "reason": "r" * 300_000})
    resp = api.http.post(
        f"{api.base}/v1/buyer/returns", data=huge, headers={**_as(key), "Content-Type": "application/json"}
    )
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "too_large"


def test_wrong_keys_are_counted_per_address_and_then_even_the_right_one_waits(api, buyer_server):
    _buyers(api, buyer_server, "acme")
    key = _key(api, "acme")
    for _ in range(10):  # a right key gives its try back: these use none up
        assert _leads(api, key).status_code == 200
    wrong = "bk_" + "A" * 43
    assert [_leads(api, wrong).status_code for _ in range(20)] == [401] * 20
    refused = _leads(api, key)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_attempts"
    assert int(refused.headers["Retry-After"]) >= 1 and "buyer API keys" in refused.json()["error"]["message"]
    # the admin token's tries are its own: this address' wrong buyer keys do not lock it out
    assert api.http.post(f"{api.base}/v1/admin/buyers/acme/api-key", headers=api.admin).status_code == 201


def test_a_buyer_of_the_longest_id_is_named_whole_in_the_audit(api, buyer_server, worker):
    long_id = "b" * 64
    _buyers(api, buyer_server, long_id)
    _sold("l1", long_id)
    resp = _return(api, _key(api, long_id), {"lead_id": "l1", "publisher_id": "surge"})
    assert resp.status_code == 200, resp.text
    with db.connection_context():
        assert LeadReturn.get(LeadReturn.lead_id == "l1").actor == f"buyer:{long_id}"
        assert AuditLog.get(AuditLog.action == "lead.returned").actor == f"buyer:{long_id}"


def _rows_read() -> int:
    reads = db.execute_sql("SHOW SESSION STATUS LIKE %s", ("Handler_read%",)).fetchall()
    return sum(int(n) for _, n in reads)


@pytest.mark.parametrize("status", [None, "returned"])
def test_a_deep_page_of_a_big_buyers_list_reads_about_a_page_of_rows(database_url, status):
    """A page reads its rows from the cursor on, by one index, however many sales the buyer has
    (docs/buyers.md "The buyer API"): not every sale of the buyer."""
    if not is_mysql():
        pytest.skip("counts MariaDB's handler reads")
    t0 = datetime(2026, 11, 1)
    with db.connection_context():
        rows = [
            {
                "publisher_id": "p",
                "lead_id": f"l{i}",
                "buyer_id": "big",
                "price": Decimal("1.00"),
                "status": "returned" if i % 2 else "sold",
                "sold_at": t0 + timedelta(seconds=i),
            }
            for i in range(4000)
        ]
        for chunk in range(0, len(rows), 1000):
            Sale.insert_many(rows[chunk : chunk + 1000]).execute()
        db.execute_sql("ANALYZE TABLE sales")
        query = buyer_sales.SaleQuery(buyer_id="big", status=status)
        first = buyer_sales.page(query, limit=50)
        middle = buyer_sales.page(query, limit=50, cursor=first.next_cursor)
        for _ in range(20):
            middle = buyer_sales.page(query, limit=50, cursor=middle.next_cursor)
        before = _rows_read()
        deep = buyer_sales.page(query, limit=50, cursor=middle.next_cursor)
        read = _rows_read() - before
    assert len(deep.items) == 50 and deep.items[0]["sold_at"] < middle.items[-1]["sold_at"]
    assert read < 400, read  # a page and its returns; the buyer has 4,000 sales


def test_under_gunicorn_a_buyer_lists_and_returns_its_routed_lead_and_a_rotated_key_stops(
    web_api, buyer_server, worker
):
    """The whole way over HTTP: a lead routed and settled, the buyer's key issued, its sale listed
    and returned with it, the key rotated and the old one refused by every web process."""
    api = web_api
    buyer_server.add("acme")
    key = api.put_publisher("surge", commission_pct="10")
    api.put_buyer("acme", buyer_server.url("acme"), price="20.00")
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "http-1"}).json()["status"] == "sold"
    api.wait_settled("http-1", "surge")
    old = _key(api, "acme")
    [item] = _leads(api, old).json()["items"]
    assert (item["lead_id"], item["publisher_id"], item["price"], item["status"]) == (
        "http-1",
        "surge",
        "20.00",
        "sold",
    )
    new = _key(api, "acme")
    assert [_leads(api, old).status_code for _ in range(4)] == [401] * 4  # whichever worker answers
    done = _return(api, new, {"lead_id": "http-1", "publisher_id": "surge", "reason": "bad phone"})
    assert done.status_code == 200 and done.json()["status"] == "returned", done.text
    assert api.get("/v1/admin/leads/http-1?publisher_id=surge").json()["status"] == "returned"
