"""GET /v1/admin/buyers, /v1/admin/publishers and /v1/admin/leads (docs/api.md "Lists, partial
updates and the operator console"): pages under a keyset cursor that walk every item once,
each item as its single GET shows it, the lead search's filters newest first, and 400
invalid_query for a bad cursor, limit or filter."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from webhooks.leads.accounting import ledger
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Sale
from webhooks.storage.states import LeadStatus

BASE = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)


def walk(api, path: str, limit: int, **params) -> list[dict]:
    """Every item of a list, page after page."""
    items: list[dict] = []
    cursor = None
    while True:
        resp = api.get(path, params={**params, "limit": limit, **({"cursor": cursor} if cursor else {})})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert set(body) == {"items", "next_cursor"}
        assert len(body["items"]) <= limit
        items += body["items"]
        cursor = body["next_cursor"]
        if cursor is None:
            return items
        assert body["items"], "a page with a next cursor has items"


def settle(items) -> None:
    with db.connection_context():
        assert ledger.settle(items) == len(items)


def lead(publisher: str, lead_id: str, at: datetime, buyer: str | None = None, price: str = "10.00", test=False):
    pub = PublisherRule(id=publisher, active=True, payout_pct=Decimal("10"))
    if buyer is None:
        outcome = Outcome(LeadStatus.TEST_UNSOLD) if test else Outcome()
    else:
        outcome = Outcome(LeadStatus.TEST_SOLD if test else LeadStatus.SOLD, buyer, Decimal(price), at)

        class Lease:  # what make_item reads of a confirmed lease
            buyer_id, lease_id, reserved_us = buyer, f"l-{lead_id}", 1

        outcome.lease = Lease()  # type: ignore[assignment]
    return settlement.make_item(
        publisher=pub, lead_id=lead_id, outcome=outcome, payload="{}", received_at=at, request_id=None
    )


@pytest.fixture
def ledger_rows(api):
    """30 leads of two publishers and two buyers, sold, unsold and test, received in ten
    instants three at a time (ties on received_at), plus one lead through the real path."""
    api.put_publisher("north")
    api.put_publisher("south")
    rows = []
    for i in range(30):
        at = BASE + timedelta(minutes=i // 3)
        publisher = "north" if i % 2 else "south"
        buyer = (None, "acme", "zen")[i % 3]
        rows.append(lead(publisher, f"l-{i:02d}", at, buyer, test=(i % 7 == 0)))
    settle(rows)
    return rows


def ids(items) -> list[tuple[str, str]]:
    return [(item["publisher_id"], item["lead_id"]) for item in items]


def newest_first(items) -> bool:
    keys = [item["received_at"] for item in items]
    return keys == sorted(keys, reverse=True)


def test_the_lead_search_walks_every_lead_once_newest_first(api, ledger_rows):
    everything = walk(api, "/v1/admin/leads", limit=100)
    assert len(everything) == 30 and newest_first(everything)
    for limit in (1, 2, 4):  # pages that end inside a tie of received_at
        paged = walk(api, "/v1/admin/leads", limit=limit)
        assert ids(paged) == ids(everything)
        assert len(set(ids(paged))) == 30


def test_each_lead_is_as_its_single_get_shows_it(api, buyer_server, worker, ledger_rows):
    buyer_server.add("acme")
    api.put_buyer("acme", buyer_server.url("acme"))
    key = api.put_publisher("east")
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "live-1", "state": "TX"}).json()["status"] == "sold"
    api.wait_settled("live-1", "east")
    items = walk(api, "/v1/admin/leads", limit=7)
    assert ("east", "live-1") in ids(items)
    for item in items:
        single = api.get(f"/v1/admin/leads/{item['lead_id']}", params={"publisher_id": item["publisher_id"]})
        assert single.json() == item
    live = next(item for item in items if item["lead_id"] == "live-1")
    assert [a["outcome"] for a in live["attempts"]] == ["accepted"]


@pytest.mark.parametrize(
    "params, expect",
    [
        ({"publisher_id": "north"}, lambda i: i % 2 == 1),
        ({"buyer_id": "acme"}, lambda i: i % 3 == 1),
        ({"status": "sold"}, lambda i: i % 3 != 0 and i % 7 != 0),
        ({"status": "unsold"}, lambda i: i % 3 == 0 and i % 7 != 0),
        ({"status": "test_sold"}, lambda i: i % 3 != 0 and i % 7 == 0),
        ({"status": "test_unsold"}, lambda i: i % 3 == 0 and i % 7 == 0),
        ({"since": (BASE + timedelta(minutes=4)).isoformat()}, lambda i: i // 3 >= 4),
        ({"until": "2026-11-20T12:04:00Z"}, lambda i: i // 3 < 4),
        (
            {"publisher_id": "south", "buyer_id": "zen", "since": "2026-11-20T13:02:00+01:00"},
            lambda i: i % 2 == 0 and i % 3 == 2 and i // 3 >= 2,
        ),
    ],
)
def test_each_filter(api, ledger_rows, params, expect):
    wanted = {("north" if i % 2 else "south", f"l-{i:02d}") for i in range(30) if expect(i)}
    found = walk(api, "/v1/admin/leads", limit=2, **params)
    assert wanted and set(ids(found)) == wanted and len(found) == len(wanted)
    assert newest_first(found)


def test_the_buyer_filter_finds_the_leads_it_bought_beside_another_buyer_on_every_page(api, ledger_rows):
    """A shared lead sold first to zen, then to acme, is acme's too: found on whichever page
    its time puts it, whatever the page size (acme's second sales are read apart)."""
    shared = [i for i in range(30) if i % 3 == 2 and i % 4 == 0 and i % 7 != 0]
    with db.connection_context():
        for i in shared:
            sold_at = (BASE + timedelta(minutes=i // 3, seconds=1)).replace(tzinfo=None)
            publisher = "north" if i % 2 else "south"
            Sale.create(
                publisher_id=publisher,
                lead_id=f"l-{i:02d}",
                buyer_id="acme",
                price="5.00",
                status="sold",
                sold_at=sold_at,
            )
    wanted = {("north" if i % 2 else "south", f"l-{i:02d}") for i in range(30) if i % 3 == 1 or i in shared}
    for limit in (1, 2, 3, 5, 100):
        found = walk(api, "/v1/admin/leads", limit=limit, buyer_id="acme")
        assert set(ids(found)) == wanted and len(found) == len(wanted) and newest_first(found), limit
    sold = walk(api, "/v1/admin/leads", limit=2, buyer_id="acme", status="sold")
    assert {(p, lead_id) for p, lead_id in ids(sold)} == {k for k in wanted if int(k[1][2:]) % 7 != 0}


def test_an_empty_query_field_is_no_filter(api, ledger_rows):
    """As a form sends the fields left empty, and as docs/api.md writes the URL."""
    empty = dict.fromkeys(("publisher_id", "status", "since", "until", "cursor", "limit"), "")
    resp = api.get("/v1/admin/leads", params={**empty, "buyer_id": "acme"})
    assert resp.status_code == 200, resp.text
    assert {item["lead_id"] for item in resp.json()["items"]} == {f"l-{i:02d}" for i in range(30) if i % 3 == 1}
    everything = api.get("/v1/admin/leads", params={**empty, "buyer_id": ""}).json()
    assert len(everything["items"]) == 30 and everything["next_cursor"] is None
    for path in ("/v1/admin/buyers", "/v1/admin/publishers"):
        resp = api.get(path, params={"cursor": "", "limit": ""})
        assert resp.status_code == 200 and resp.json()["next_cursor"] is None, resp.text


def test_a_test_lead_shows_its_outcome_and_filters_by_the_ledgers_status(api, ledger_rows):
    found = walk(api, "/v1/admin/leads", limit=50, status="test_sold")
    assert found and all(item["status"] == "sold" and item["test"] for item in found)


def cursor_of(value) -> str:
    import json

    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "path, params",
    [
        ("/v1/admin/leads", {"limit": "0"}),
        ("/v1/admin/leads", {"limit": "501"}),
        ("/v1/admin/leads", {"limit": "ten"}),
        ("/v1/admin/leads", {"cursor": "not a cursor"}),
        ("/v1/admin/leads", {"cursor": cursor_of(["2026-11-20T12:00:00", "7"])}),
        ("/v1/admin/leads", {"cursor": cursor_of({"id": 1})}),
        ("/v1/admin/leads", {"cursor": cursor_of(["acme"])}),
        ("/v1/admin/leads", {"status": "bought"}),
        ("/v1/admin/leads", {"since": "yesterday"}),
        ("/v1/admin/leads", {"since": "2026-11-20T12:00:00"}),  # no offset
        ("/v1/admin/leads", {"until": "2026-13-01T00:00:00Z"}),
        ("/v1/admin/leads", {"publisher_id": "no spaces"}),
        ("/v1/admin/buyers", {"limit": "-1"}),
        ("/v1/admin/buyers", {"cursor": cursor_of(["2026-11-20T12:00:00", 7])}),
        ("/v1/admin/publishers", {"cursor": "%%%"}),
    ],
)
def test_a_bad_cursor_limit_or_filter_is_400(api, path, params):
    resp = api.get(path, params=params)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_query"


def test_buyers_are_listed_by_id_as_their_get_shows_them_deleted_ones_not(api, buyer_server):
    for bid in ("delta", "alpha", "echo", "charlie", "bravo"):
        api.put_buyer(bid, buyer_server.url(bid), caps={"daily": 5})
    api.put_buyer(
        "foxtrot",
        buyer_server.url("foxtrot"),
        billing={"mode": "prepaid", "account": "acct-f", "currency": "USD"},
    )
    assert api.http.delete(f"{api.base}/v1/admin/buyers/charlie", headers=api.admin).status_code == 204
    listed = walk(api, "/v1/admin/buyers", limit=2)
    assert [b["id"] for b in listed] == ["alpha", "bravo", "delta", "echo", "foxtrot"]
    for item in listed:
        assert api.get(f"/v1/admin/buyers/{item['id']}").json() == item
    assert "balance" in listed[-1] and "balance" not in listed[0]
    assert listed[0]["usage"]["daily"]["limit"] == 5


def test_publishers_are_listed_by_id_as_their_get_shows_them(api):
    for pid in ("p3", "p1", "p2"):
        api.put_publisher(pid, caps={"hourly": 10} if pid == "p2" else {})
    listed = walk(api, "/v1/admin/publishers", limit=1)
    assert [p["id"] for p in listed] == ["p1", "p2", "p3"]
    for item in listed:
        assert api.get(f"/v1/admin/publishers/{item['id']}").json() == item
    assert listed[1]["usage"]["hourly"]["limit"] == 10
    assert api.get("/v1/admin/publishers").json()["next_cursor"] is None
