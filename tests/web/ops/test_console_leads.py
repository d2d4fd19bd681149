"""The console's lead search: one box for an id, e-mail or phone (found by the normalised value,
however typed), pick-lists and UTC days, a CSV of the whole search, a bulk return reporting each
lead, and a lead's own fields (none once erased)."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import replace
from datetime import datetime, timezone
from decimal import Decimal

from tests.conftest import ADMIN_TOKEN
from tests.web.ops.conftest import post
from tests.web.people.test_users import SAME_SITE, csrf, user_client
from webhooks.leads.accounting import ledger, lookup, search
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, Sale

PUB = PublisherRule(id="pub-s", active=True, payout_pct=Decimal("10"))


def _settled(lead_id: str, body: str, at: datetime, publisher: PublisherRule = PUB) -> None:
    """An unsold lead of `publisher` with the body `body`, written to the ledger."""
    item = settlement.make_item(
        publisher=publisher,
        lead_id=lead_id,
        outcome=Outcome(attempts=[]),
        payload=body,
        received_at=at,
        request_id=None,
    )
    with db.connection_context():
        assert ledger.settle([item]) == 1


def _rows(html: str) -> list[str]:
    """The lead ids the search's table shows, in order."""
    return re.findall(r'<tr data-lead="([^"]+)"', html)


def _sold(api, buyer_server, *lead_ids: str, buyer: str = "bk", **fields) -> None:
    buyer_server.add(buyer)
    api.put_buyer(buyer, buyer_server.url(buyer), price="8.00", **fields)
    key = api.put_publisher("pub-b", commission_pct="10")
    api.settle_config()
    for lead_id in lead_ids:
        assert api.post_lead(key, {"lead_id": lead_id}).json()["status"] == "sold"
    for lead_id in lead_ids:
        api.wait_settled(lead_id, "pub-b")


def test_a_lead_is_found_by_its_email_or_phone_however_typed(api, browser, buyer_server, worker):
    buyer_server.add("look")
    api.put_buyer("look", buyer_server.url("look"), price="8.00")
    key = api.put_publisher("pub-l", commission_pct="10")
    api.settle_config()
    ada = {"lead_id": "l-ada", "email": "Ada.Lovelace@Example.COM", "phone": "(512) 555-0100"}
    bob = {"lead_id": "l-bob", "email": "bob@example.com", "phone": "+1 512 555 0199"}
    for body in (ada, bob):
        assert api.post_lead(key, body).json()["status"] == "sold"
        api.wait_settled(body["lead_id"], "pub-l")  # settled by the worker, as in production
    http = browser[0]
    for typed in (" ada.lovelace@example.com ", "ADA.LOVELACE@EXAMPLE.COM", "512-555-0100", "+15125550100", "l-ada"):
        page = http.get(api.base + "/ops/leads", params={"q": typed})
        assert page.status_code == 200 and _rows(page.text) == ["l-ada"], typed
    assert _rows(http.get(api.base + "/ops/leads", params={"q": "nobody@example.com"}).text) == []
    # the admin API's search takes the same box, and combines it with the other filters
    found = api.get("/v1/admin/leads", params={"q": "(512) 555 0199"}).json()["items"]
    assert [lead["lead_id"] for lead in found] == ["l-bob"]
    assert api.get("/v1/admin/leads", params={"q": "bob@example.com", "buyer_id": "other"}).json()["items"] == []
    refused = http.get(api.base + "/ops/leads", params={"q": "not a thing"})
    assert refused.status_code == 400 and "must be a lead id, an e-mail address or a phone number" in refused.text
    assert api.get("/v1/admin/leads", params={"q": "x" * 321}).status_code == 400
    with db.connection_context():  # keyed digests, never the address or number
        row = Lead.get(Lead.lead_id == "l-ada")
    assert re.fullmatch("[0-9a-f]{32}", row.email_digest) and re.fullmatch("[0-9a-f]{32}", row.phone_digest)
    assert row.email_digest == lookup.digest(lookup.DEFAULT_KEY, "ada.lovelace@example.com")
    assert row.phone_digest == lookup.digest(lookup.DEFAULT_KEY, "+15125550100")


def test_the_search_has_pick_lists_and_utc_days(api, browser):
    api.put_publisher("pub-s")
    api.put_buyer("bk-day", "http://127.0.0.1:9/bk")
    late = datetime(2026, 12, 1, 23, 30, tzinfo=timezone.utc)
    early = datetime(2026, 12, 2, 0, 30, tzinfo=timezone.utc)
    _settled("d-late", '{"email": "a@example.com"}', late)
    _settled("d-early", '{"email": "b@example.com"}', early)
    http = browser[0]
    page = http.get(api.base + "/ops/leads").text
    assert '<select name="publisher_id">' in page and "<option>pub-s</option>" in page
    assert '<select name="buyer_id">' in page and "<option>bk-day</option>" in page
    assert '<input type="date" name="since" value="">' in page and "UTC day" in page
    day_of = http.get(api.base + "/ops/leads", params={"since": "2026-12-01", "until": "2026-12-01"}).text
    assert _rows(day_of) == ["d-late"] and '<input type="date" name="until" value="2026-12-01">' in day_of
    assert _rows(http.get(api.base + "/ops/leads", params={"since": "2026-12-02"}).text) == ["d-early"]
    iso = http.get(api.base + "/ops/leads", params={"until": "2026-12-02T00:00:00+00:00"}).text
    assert _rows(iso) == ["d-late"] and 'value="2026-12-02T00:00:00+00:00"' in iso  # the instant stays as typed
    picked = http.get(api.base + "/ops/leads", params={"publisher_id": "pub-s"}).text
    assert "<option selected>pub-s</option>" in picked
    assert http.get(api.base + "/ops/leads", params={"since": "2026-13-01"}).status_code == 400
    every_day = {"since": "0001-01-01", "until": "9999-12-31"}  # the last day: no bound, never an overflow
    assert len(_rows(http.get(api.base + "/ops/leads", params=every_day).text)) == 2
    returns = http.get(api.base + "/ops/returns", params={"buyer_id": "bk-day"}).text
    assert "<option selected>bk-day</option>" in returns and "<option>pub-s</option>" in returns


def test_the_csv_streams_every_lead_of_the_search_with_formula_cells_neutralised(api, browser, monkeypatch):
    monkeypatch.setattr(search, "CSV_PAGE", 2)  # three pages of the cursor for five leads
    other = replace(PUB, id="pub-o")
    at = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
    for n, lead_id in enumerate(("c-1", "-2+3", "c-3", "@SUM", "c-5")):
        _settled(lead_id, "{}", at.replace(minute=n))
    _settled("c-other", "{}", at, publisher=other)
    resp = browser[0].get(api.base + "/ops/leads.csv", params={"publisher_id": "pub-s", "since": "2026-12-03"})
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/csv")
    assert resp.headers["Cache-Control"] == "no-store"
    header, *rows = list(csv.reader(io.StringIO(resp.text)))
    assert tuple(header) == search.CSV_COLUMNS
    assert [r[2] for r in rows] == ["c-5", "'@SUM", "c-3", "'-2+3", "c-1"]  # newest first, all pages
    assert {r[1] for r in rows} == {"pub-s"}
    page = browser[0].get(api.base + "/ops/leads", params={"publisher_id": "pub-s", "limit": "2"}).text
    assert 'id="leads-csv" href="/ops/leads.csv?publisher_id=pub-s"' in page  # the filters, not the page
    assert browser[0].get(api.base + "/ops/leads.csv", params={"status": "lost"}).status_code == 400


def test_a_bulk_return_reports_what_happened_to_each_lead(api, browser, buyer_server, worker):
    _sold(api, buyer_server, "b-1", "b-2", "b-3", returns={"reasons": ["bad_phone"]})
    _settled(
        "b-unsold",
        "{}",
        datetime.now(timezone.utc),
        publisher=PublisherRule(id="pub-b", active=True, payout_pct=Decimal("10")),
    )
    assert (
        post(api, browser, "/ops/leads/b-1/return", {"publisher_id": "pub-b", "reason": "bad_phone"}).status_code == 303
    )
    page = browser[0].get(api.base + "/ops/leads", params={"publisher_id": "pub-b"}).text
    assert 'value="pub-b:b-2"' in page and 'value="pub-b:b-1"' not in page and 'id="bulk-return"' in page

    picked = ["pub-b:b-1", "pub-b:b-2", "pub-b:b-unsold", "pub-b:b-none"]
    resp = post(api, browser, "/ops/leads/return?publisher_id=pub-b", {"lead": picked, "reason": "bad_phone"})
    assert resp.status_code == 200, resp.text[:500]
    outcomes = dict(re.findall(r'data-result="([^"]+)" data-outcome="([^"]+)"', resp.text))
    assert outcomes == {
        "pub-b:b-1": "refused",
        "pub-b:b-2": "returned",
        "pub-b:b-unsold": "refused",
        "pub-b:b-none": "refused",
    }
    assert "was returned already" in resp.text and "is not settled" in resp.text
    assert _rows(resp.text)  # the search shown again under the results
    with db.connection_context():
        statuses = {s.lead_id: s.status for s in Sale.select().where(Sale.publisher_id == "pub-b")}
    assert statuses == {"b-1": "returned", "b-2": "returned", "b-3": "sold"}

    wrong_reason = post(api, browser, "/ops/leads/return", {"lead": ["pub-b:b-3"], "reason": "other"})
    assert 'data-outcome="refused"' in wrong_reason.text and "must be one of bad_phone" in wrong_reason.text
    too_many = post(api, browser, "/ops/leads/return", {"lead": [f"pub-b:x-{n}" for n in range(101)]})
    assert too_many.status_code == 400 and "from 1 to 100 leads" in too_many.text
    unsigned = browser[0].post(api.base + "/ops/leads/return", data={"lead": ["pub-b:b-3"], "reason": "bad_phone"})
    assert unsigned.status_code == 403
    with db.connection_context():
        assert Sale.get(Sale.lead_id == "b-3").status == "sold"


def test_a_bulk_return_to_a_reviewing_buyer_waits_in_its_queue_picked_by_buyer(api, browser, buyer_server, worker):
    _sold(api, buyer_server, "r-1", buyer="rv", returns={"review": "manual"})
    resp = post(api, browser, "/ops/leads/return?buyer_id=rv", {"lead": ["pub-b:r-1"], "reason": "wrong number"})
    assert resp.status_code == 200 and 'data-result="pub-b:r-1" data-outcome="return_pending"' in resp.text
    http = browser[0]
    picks = (({"buyer_id": "rv"}, True), ({"publisher_id": "pub-b"}, True), ({"buyer_id": "nobody"}, False))
    for picked, shown in picks:
        queue = http.get(api.base + "/ops/returns", params=picked).text
        assert ('<tr data-return="ret_' in queue) is shown, picked
    assert "<option selected>rv</option>" in http.get(api.base + "/ops/returns", params={"buyer_id": "rv"}).text


def test_an_analyst_may_not_bulk_return(app, api, buyer_server, worker):
    _sold(api, buyer_server, "a-1")
    analyst = user_client(app, api, "ana@example.com", "analyst")
    assert analyst.get("/ops/leads").status_code == 200
    resp = analyst.post(
        "/ops/leads/return", data={"lead": "pub-b:a-1", "csrf_token": csrf(analyst, "/ops/leads")}, headers=SAME_SITE
    )
    assert resp.status_code == 403
    with db.connection_context():
        assert Sale.get(Sale.lead_id == "a-1").status == "sold"


def test_a_leads_fields_are_shown_escaped_and_nothing_of_them_once_erased(api, browser):
    api.put_publisher("pub-s")
    body = (
        '{"email": "Grace@Example.com", "phone": "+15125550142", "<b>name</b>": "<script>alert(1)</script>",'
        ' "address": {"zip": "78701"}}'
    )
    _settled("f-1", body, datetime.now(timezone.utc))
    http = browser[0]
    page = http.get(api.base + "/ops/leads/f-1").text
    assert 'id="fields"' in page and "Grace@Example.com" in page and "+15125550142" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert 'data-field="&lt;b&gt;name&lt;/b&gt;"' in page and "{&#34;zip&#34;: &#34;78701&#34;}" in page
    assert _rows(http.get(api.base + "/ops/leads", params={"q": "grace@example.com"}).text) == ["f-1"]

    erased = api.http.delete(
        f"{api.base}/v1/admin/leads/f-1/personal-data", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert erased.status_code in (200, 202), erased.text
    page = http.get(api.base + "/ops/leads/f-1").text
    assert 'id="fields-erased"' in page and "Erased on" in page and 'id="fields"' not in page
    assert "Grace" not in page and "15125550142" not in page and "78701" not in page
    with db.connection_context():
        row = Lead.get(Lead.lead_id == "f-1")
    assert (row.payload, row.email_digest, row.phone_digest) == ("", None, None)
    for typed in ("grace@example.com", "+15125550142"):  # nothing left to find it by
        assert _rows(http.get(api.base + "/ops/leads", params={"q": typed}).text) == []
    assert _rows(http.get(api.base + "/ops/leads", params={"q": "f-1"}).text) == ["f-1"]
