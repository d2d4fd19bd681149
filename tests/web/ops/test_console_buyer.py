"""A buyer's console page and the buyers list: its figures are its row of the report by buyer
(the same source, so they never disagree), a test lead sent to a real local buyer (yes, no,
past the deadline, a ping/post buyer's bid) writes nothing but its audit row, the list pauses
and resumes the buyers ticked in one post with an audit row each, and an analyst does
neither."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser

import pytest

from tests.web.ops.conftest import post
from tests.web.people.test_users import SAME_SITE, csrf, user_client
from webhooks import services
from webhooks.storage.live import keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, Buyer, Lead, LeadAttempt, LeadStats, Sale


class Tags(HTMLParser):
    """Every start tag's attributes, and the text inside each element with an id."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[dict[str, str | None]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append({"tag": tag, **dict(attrs)})

    def having(self, attr: str, value: str | None = None) -> list[dict[str, str | None]]:
        return [t for t in self.tags if attr in t and (value is None or t[attr] == value)]


def page(api, browser, path: str) -> str:
    resp = browser[0].get(api.base + path)
    assert resp.status_code == 200, resp.text[:300]
    return resp.text


def report_row(api, buyer_id: str, first, last) -> dict:
    params = {"from": first.isoformat(), "to": last.isoformat(), "group_by": "buyer"}
    rows = api.get("/v1/admin/reports/leads", params=params).json()["rows"]
    return next(r for r in rows if r["key"] == buyer_id)


def audit_of(buyer_id: str, action: str) -> list[AuditLog]:
    with db.connection_context():
        query = AuditLog.select().where(AuditLog.entity_id == buyer_id, AuditLog.action == action)
        return list(query.order_by(AuditLog.id))


def test_a_buyers_figures_are_its_row_of_the_report(api, browser, buyer_server, worker):
    """`half` says no to every second post: 10 offers, 5 yes, one sale returned; `rest` takes
    what half refused. The page's figures of today and of 7 days, and its hourly chart, are
    the report's for the same buyer and days."""
    buyer_server.add("half").reject_every = 2
    buyer_server.add("rest")
    key = api.put_publisher("surge", commission_pct="10")
    api.put_buyer("half", buyer_server.url("half"), priority=1, price="10.00", caps={"daily": 100})
    api.put_buyer("rest", buyer_server.url("rest"), priority=2, price="3.00")
    api.settle_config()
    for n in range(10):
        assert api.post_lead(key, {"lead_id": f"h{n}"}).status_code == 200
    for n in range(10):
        api.wait_settled(f"h{n}", "surge")
    returned = api.http.post(
        f"{api.base}/v1/admin/leads/h0/return?publisher_id=surge", json={"reason": "bad"}, headers=api.admin
    )
    assert returned.status_code == 200, returned.text

    today = datetime.now(timezone.utc).date()
    tags = Tags(page(api, browser, "/ops/buyers/half"))
    shown = {t["data-period"]: t for t in tags.having("data-period")}
    for period, first in (("today", today), ("last 7 days", today - timedelta(days=6))):
        row = report_row(api, "half", first, today)
        assert {
            k: shown[period][f"data-{k.replace('_', '-')}"]
            for k in ("offers", "accept_rate", "sales", "revenue", "epl", "returned")
        } == {k: str(row[k]) for k in ("offers", "accept_rate", "sales", "revenue", "epl", "returned")}
    assert (shown["today"]["data-offers"], shown["today"]["data-accept-rate"], shown["today"]["data-epl"]) == (
        "10",
        "0.5",
        "4.00",
    )  # 5 sales of 10.00, one returned: 40.00 over 10 offers

    hours = [t for t in tags.having("data-hour") if t["tag"] == "g"]
    buyer_chart = hours[-24:]  # the page's one chart: this buyer's
    assert len(hours) == 24 and sum(int(h["data-offers"]) for h in buyer_chart) == 10
    assert sum(int(h["data-sales"]) for h in buyer_chart) == 5

    usage = api.get("/v1/admin/buyers/half").json()["usage"]["daily"]
    bar = tags.having("data-cap", "daily")[0]
    assert bar["data-owner"] == "half" and f"{usage['used']} / {usage['limit']}" in page(
        api, browser, "/ops/buyers/half"
    )


def test_the_circuit_reads_as_its_health_and_the_statement_figures_sit_under_their_headers(api, browser, buyer_server):
    api.put_buyer(
        "acme", buyer_server.url("acme"), billing={"mode": "prepaid", "account": "acme@example.com", "currency": "USD"}
    )
    text = page(api, browser, "/ops/buyers/acme")
    assert "circuit: healthy" in text and ">circuit closed<" not in text
    statement = text.split('<table id="statement"', 1)[1].split("</table>", 1)[0]
    headers = re.findall(r"<th( [^>]*)?>", statement)
    cells = re.findall(r"<td( [^>]*)?>", statement)
    assert len(headers) == len(cells) == 6 and all('class="num"' in h for h in headers + cells)
    assert "circuit: healthy" in page(api, browser, "/ops/buyers")

    r = services.of(api.app).store.redis
    r.hset(keys.breaker("acme"), mapping={"open_until": int(time.time() * 1000) + 60_000, "failures": 3})
    assert "circuit: open - failing" in page(api, browser, "/ops/buyers/acme")
    r.hset(keys.breaker("acme"), "open_until", int(time.time() * 1000) - 1)
    assert "circuit: half-open - probing" in page(api, browser, "/ops/buyers")


def ledger_untouched(buyer_id: str) -> None:
    with db.connection_context():
        counts = [m.select().count() for m in (Lead, LeadAttempt, Sale, LeadStats)]
    assert counts == [0, 0, 0, 0]


def send_test(api, browser, buyer_id: str, lead: str = "") -> tuple[int, dict, str]:
    resp = post(api, browser, f"/ops/buyers/{buyer_id}/test-lead", {"lead": lead})
    found = Tags(resp.text).having("id", "test-lead-result")
    return resp.status_code, found[0] if found else {}, resp.text


@pytest.mark.parametrize(
    ("mode", "outcome", "status"),
    [("accept", "accepted", "200"), ("reject", "rejected", "200"), ("reject400", "rejected", "400")],
)
def test_a_test_lead_shows_the_buyers_answer_and_writes_nothing_but_its_audit_row(
    api, browser, buyer_server, mode, outcome, status
):
    stub = buyer_server.add("acme", mode)
    api.put_buyer("acme", buyer_server.url("acme"), price="10.00", caps={"daily": 5})
    code, result, _ = send_test(api, browser, "acme")
    assert code == 200 and (result["data-sent"], result["data-outcome"], result["data-status"]) == (
        "post",
        outcome,
        status,
    )
    assert int(result["data-ms"]) >= 0
    (received,) = stub.received
    assert received["headers"]["X-Floodgate-Test"] == "1"
    assert received["body"]["lead"]["email"] == "test.lead@example.com" and received["body"]["price"] == "10.00"
    ledger_untouched("acme")
    assert api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == 0
    (row,) = audit_of("acme", "buyer.test_lead")
    assert row.actor == "admin" and f'"outcome": "{outcome}"' in row.detail


def test_a_test_lead_past_the_deadline_is_a_timeout_and_a_billed_buyers_balance_stays(
    api, browser, buyer_server, reconfigure
):
    reconfigure(buyer_timeout_ms=300)
    buyer_server.add("slow", "sleep", delay=1.5)
    billing = {"mode": "prepaid", "account": "slow@example.com", "currency": "USD"}
    api.put_buyer("slow", buyer_server.url("slow"), price="10.00", billing=billing)
    before = api.get("/v1/admin/buyers/slow").json()["balance"]
    code, result, _ = send_test(api, browser, "slow")
    assert code == 200 and (result["data-outcome"], result["data-status"]) == ("timeout", "0")
    assert 300 <= int(result["data-ms"]) < 1500
    assert api.get("/v1/admin/buyers/slow").json()["balance"] == before
    ledger_untouched("slow")
    breaker = api.get("/v1/admin/buyers/slow").json()["breaker"]
    assert (breaker["state"], breaker["failures"]) == ("closed", 0)  # a test never moves the circuit


def test_a_ping_post_buyers_test_lead_is_pinged_never_posted(api, browser, buyer_server):
    ping = buyer_server.add("acme-ping", "reply")
    ping.reply = (200, b'{"bid": 7.5}', "application/json")
    posts = buyer_server.add("acme")
    api.put_buyer(
        "acme", buyer_server.url("acme"), ping={"url": buyer_server.url("acme-ping"), "bid": "bid", "min_bid": "1.00"}
    )
    code, result, _ = send_test(api, browser, "acme")
    assert code == 200 and (result["data-sent"], result["data-outcome"], result["data-bid"]) == ("ping", "bid", "7.50")
    assert ping.received[0]["headers"]["X-Floodgate-Test"] == "1" and posts.received == []
    ping.reply = (200, b'{"bid": 0.5}', "application/json")  # under min_bid
    assert send_test(api, browser, "acme")[1]["data-outcome"] == "no_bid"
    ledger_untouched("acme")


def test_a_test_leads_reply_is_cut_and_escaped_and_its_json_bounded(api, browser, buyer_server):
    stub = buyer_server.add("acme", "reply")
    stub.reply = (200, b"<script>alert(1)</script>" + b"x" * 5000, "text/html")
    api.put_buyer("acme", buyer_server.url("acme"))
    code, result, text = send_test(api, browser, "acme", '{"lead_id": "t-1", "email": "me@example.com"}')
    assert code == 200 and result["data-outcome"] == "error"
    assert "<script>alert" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "x" * (2000 - len("<script>alert(1)</script>")) in text and "x" * 2000 not in text  # its first 2,000
    assert stub.received[0]["body"]["lead_id"] == "t-1"

    for bad in ("[1, 2]", '{"a": 1, "a": 2}', "{not json", '{"lead_id": "bad id"}', '{"x": "' + "y" * 9000 + '"}'):
        code, result, text = send_test(api, browser, "acme", bad)
        assert code == 400 and result == {} and 'data-error-for="lead"' in text, bad
    assert len(stub.received) == 1 and len(audit_of("acme", "buyer.test_lead")) == 1


def active(buyer_id: str) -> bool:
    with db.connection_context():
        return bool(Buyer.get_by_id(buyer_id).active)


def test_the_list_pauses_and_resumes_the_buyers_ticked_as_one_pause_each_would(api, browser, buyer_server):
    for buyer_id in ("a", "b", "c", "gone"):
        api.put_buyer(buyer_id, buyer_server.url(buyer_id))
    api.http.delete(f"{api.base}/v1/admin/buyers/gone", headers=api.admin)
    assert post(api, browser, "/ops/buyers/c/pause", {}).status_code == 303
    single = audit_of("c", "buyer.update")[-1].detail
    assert post(api, browser, "/ops/buyers/c/resume", {}).status_code == 303
    before = {b: len(audit_of(b, "buyer.update")) for b in "abc"}

    fields = [("action", "pause"), *(("buyer_id", b) for b in ("a", "c", "gone", "ghost", "a"))]
    resp = post(api, browser, "/ops/selected-buyers", fields)
    assert resp.status_code == 200
    done = Tags(resp.text).having("id", "selected-done")[0]
    assert done["data-action"] == "pause" and "gone, ghost" in resp.text
    assert (active("a"), active("b"), active("c")) == (False, True, False)
    after = {b: len(audit_of(b, "buyer.update")) for b in "abc"}
    assert after == {"a": before["a"] + 1, "b": before["b"], "c": before["c"] + 1}
    assert audit_of("c", "buyer.update")[-1].detail == single  # the row a pause of its own leaves
    assert api.get("/v1/admin/buyers/a").json()["active"] is False

    resp = post(api, browser, "/ops/selected-buyers", [("action", "resume"), ("buyer_id", "a"), ("buyer_id", "b")])
    assert resp.status_code == 200 and (active("a"), active("b"), active("c")) == (True, True, False)


@pytest.mark.parametrize(
    "fields",
    [
        [("action", "pause")],
        [("action", "delete"), ("buyer_id", "a")],
        [("action", "pause"), ("buyer_id", "a"), ("buyer_id", "bad id")],
        [("action", "pause"), *(("buyer_id", f"b{n}") for n in range(501))],
    ],
)
def test_a_selection_it_cannot_take_changes_nothing(api, browser, buyer_server, fields):
    api.put_buyer("a", buyer_server.url("a"))
    resp = post(api, browser, "/ops/selected-buyers", fields)
    assert resp.status_code == 400 and 'id="selected-error"' in resp.text
    assert active("a") and len(audit_of("a", "buyer.update")) == 0


def test_an_analyst_can_neither_send_a_test_lead_nor_pause_the_selected(app, api, buyer_server):
    stub = buyer_server.add("acme")
    api.put_buyer("acme", buyer_server.url("acme"))
    analyst = user_client(app, api, "ana@example.com", "analyst")
    assert analyst.get("/ops/buyers/acme").status_code == 200
    token = csrf(analyst, "/ops/buyers")
    for path, fields in (
        ("/ops/buyers/acme/test-lead", {"lead": ""}),
        ("/ops/selected-buyers", {"action": "pause", "buyer_id": "acme"}),
    ):
        resp = analyst.post(path, data={**fields, "csrf_token": token}, headers=SAME_SITE)
        assert resp.status_code == 403, (path, resp.status_code)
    assert stub.arrived == [] and active("acme") and audit_of("acme", "buyer.test_lead") == []


def test_both_posts_need_the_sessions_csrf_token(api, browser, buyer_server):
    stub = buyer_server.add("acme")
    api.put_buyer("acme", buyer_server.url("acme"))
    headers = {"Origin": api.base, "Sec-Fetch-Site": "same-origin"}
    for path, fields in (
        ("/ops/buyers/acme/test-lead", {"lead": ""}),
        ("/ops/selected-buyers", {"action": "pause", "buyer_id": "acme"}),
    ):
        resp = browser[0].post(api.base + path, data=fields, headers=headers, allow_redirects=False)
        assert resp.status_code == 403, (path, resp.status_code)
    assert stub.arrived == [] and active("acme")
