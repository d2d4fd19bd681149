"""GET /v1/admin/reports/leads (docs/api.md "Reports"): the figures of a ledger built by real
traffic (two publishers, two buyers, sold, unsold, a return, a test lead) and by the settlement
path for the day before, grouped by publisher, buyer, day and hour, as JSON and as CSV; the
offers, accept rate and earnings per offer of a buyer that says no to every other lead."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from webhooks.leads.accounting import ledger
from webhooks.leads.accounting.item import SettlementItem
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db
from webhooks.storage.states import LeadStatus

TODAY = datetime.now(timezone.utc)
YESTERDAY = TODAY - timedelta(days=1)


def report(api, group_by: str, fmt: str = "json"):
    return api.get(
        "/v1/admin/reports/leads",
        params={
            "from": YESTERDAY.date().isoformat(),
            "to": TODAY.date().isoformat(),
            "group_by": group_by,
            "format": fmt,
        },
    )


def figures(leads, sold, returned, revenue, payout, rate, sales=None, offers=0, accept_rate="0", epl="0.00") -> dict:
    return {
        "leads": leads,
        "sold": sold,
        "unsold": leads - sold,
        "sales": sold if sales is None else sales,  # an exclusive lead's one sale
        "returned": returned,
        "revenue": revenue,
        "payout": payout,
        "profit": f"{Decimal(revenue) - Decimal(payout):.2f}",
        "return_rate": rate,
        "offers": offers,
        "accept_rate": accept_rate,
        "conversions": 0,
        "epl": epl,
    }


@pytest.fixture
def traffic(api, buyer_server, worker):
    buyer_server.add("acme")
    buyer_server.add("zen")
    surge = api.put_publisher("surge", commission_pct="10")
    other = api.put_publisher("other", payout={"type": "fixed", "amount": "2.00"})
    api.put_buyer("acme", buyer_server.url("acme"), priority=1, price="10.00", states=["TX"])
    api.put_buyer("zen", buyer_server.url("zen"), priority=2, price="20.00", states=["OK"])
    api.settle_config()
    sent = [
        (surge, "s-tx", "TX", "sold"),
        (surge, "s-ok", "OK", "sold"),
        (surge, "s-ca", "CA", "unsold"),
        (other, "o-1", "TX", "sold"),
        (other, "o-2", "TX", "sold"),
    ]
    for key, lead_id, state, status in sent:
        assert api.post_lead(key, {"lead_id": lead_id, "state": state}).json()["status"] == status
    assert api.post_lead(surge, {"lead_id": "s-test", "state": "TX", "test": True}).json()["test"] is True
    for key, lead_id, *_ in sent:
        api.wait_settled(lead_id, "surge" if key == surge else "other")
    api.wait_settled("s-test", "surge")
    resp = api.http.post(
        f"{api.base}/v1/admin/leads/o-2/return?publisher_id=other", json={"reason": "bad"}, headers=api.admin
    )
    assert resp.status_code == 200
    # the day before, through the settlement path the worker runs
    pub = PublisherRule(id="surge", active=True, payout_pct=Decimal("10"))
    sold = Outcome(LeadStatus.SOLD, "acme", Decimal("10.00"), YESTERDAY)

    class Lease:  # what make_item reads of a confirmed lease
        buyer_id, lease_id, reserved_us = "acme", "y-lease", 1

    sold.lease = Lease()  # type: ignore[assignment]
    items = [
        settlement.make_item(
            publisher=pub, lead_id="y-tx", outcome=sold, payload="{}", received_at=YESTERDAY, request_id=None
        ),
        settlement.make_item(
            publisher=pub, lead_id="y-ca", outcome=Outcome(), payload="{}", received_at=YESTERDAY, request_id=None
        ),
    ]
    with db.connection_context():
        assert ledger.settle(items) == 2


def test_the_report_by_publisher_has_the_contracts_figures_and_totals(api, traffic):
    body = report(api, "publisher").json()
    assert (body["from"], body["to"], body["group_by"]) == (
        YESTERDAY.date().isoformat(),
        TODAY.date().isoformat(),
        "publisher",
    )
    rows = {r.pop("key"): r for r in body["rows"]}
    assert rows == {
        "other": figures(2, 2, 1, "10.00", "2.00", "0.5", offers=2, accept_rate="1", epl="5.00"),
        "surge": figures(5, 3, 0, "40.00", "4.00", "0", offers=2, accept_rate="1", epl="20.00"),
    }  # the day before's sale was made by no attempt: no offer
    assert body["totals"] == figures(7, 5, 1, "50.00", "6.00", "0.2", offers=4, accept_rate="1", epl="12.50")


def test_the_report_by_buyer_day_and_hour(api, traffic):
    by_buyer = {r.pop("key"): r for r in report(api, "buyer").json()["rows"]}
    assert by_buyer == {
        None: figures(2, 0, 0, "0.00", "0.00", "0"),  # the unsold leads: no buyer
        "acme": figures(4, 4, 1, "30.00", "4.00", "0.25", offers=3, accept_rate="1", epl="10.00"),
        "zen": figures(1, 1, 0, "20.00", "2.00", "0", offers=1, accept_rate="1", epl="20.00"),
    }
    by_day = {r.pop("key"): r for r in report(api, "day").json()["rows"]}
    assert by_day == {
        YESTERDAY.date().isoformat(): figures(2, 1, 0, "10.00", "1.00", "0"),
        TODAY.date().isoformat(): figures(5, 4, 1, "40.00", "5.00", "0.25", offers=4, accept_rate="1", epl="10.00"),
    }
    by_hour = report(api, "hour").json()
    assert sum(r["leads"] for r in by_hour["rows"]) == 7
    # the live leads' hour: the module's TODAY, or a later one when a slow run crossed the hour
    hours = {t.strftime("%Y-%m-%dT%H:00:00Z") for t in (TODAY, datetime.now(timezone.utc))}
    assert by_hour["rows"][-1]["key"] in hours


def test_the_report_as_csv(api, traffic):
    resp = report(api, "publisher", "csv")
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(resp.text)))
    header = ["key", "leads", "sold", "unsold", "sales", "returned", "revenue", "payout", "profit", "return_rate"]
    assert rows[0] == [*header, "offers", "accept_rate", "conversions", "epl"]
    assert rows[1:] == [
        ["other", "2", "2", "0", "2", "1", "10.00", "2.00", "8.00", "0.5", "2", "1", "0", "5.00"],
        ["surge", "5", "3", "2", "3", "0", "40.00", "4.00", "36.00", "0", "2", "1", "0", "20.00"],
    ]


@pytest.mark.parametrize(
    "params",
    [
        {"from": "2026-12-01", "to": "2026-11-30"},
        {"from": "2026-12-01\n", "to": "2026-12-02"},
        {"from": "2026-13-01", "to": "2026-12-02"},
        {"from": "2026-12-01"},
        {"from": "2026-12-01", "to": "2026-12-02", "group_by": "month"},
        {"from": "2026-12-01", "to": "2026-12-02", "format": "xml"},
        {"from": "2020-01-01", "to": "2026-12-02"},
    ],
)
def test_a_report_query_it_cannot_answer_is_400(api, params):
    resp = api.get("/v1/admin/reports/leads", params=params)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_query"


def test_an_empty_window_is_an_empty_report(api):
    body = api.get("/v1/admin/reports/leads", params={"from": "2020-01-01", "to": "2020-01-02"}).json()
    assert body["rows"] == [] and body["totals"] == figures(0, 0, 0, "0.00", "0.00", "0")


def test_csv_cells_that_a_spreadsheet_would_run_as_formulas_are_escaped(api, buyer_server, worker):
    buyer_server.add("acme")
    key = api.put_publisher("-A1-B1", payout={"type": "fixed", "amount": "5.00"})  # a valid id
    api.put_buyer("acme", buyer_server.url("acme"), price="1.00")
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "f-1"}).json()["status"] == "sold"
    api.wait_settled("f-1", "-A1-B1")
    rows = list(csv.reader(io.StringIO(report(api, "publisher", "csv").text)))
    # the id is text: escaped; the loss is a figure: a negative number a spreadsheet adds up
    assert rows[1:] == [["'-A1-B1", "1", "1", "0", "1", "0", "1.00", "5.00", "-4.00", "0", "1", "1", "0", "1.00"]]


def test_offers_accept_rate_and_epl_of_a_buyer_saying_no_to_every_other_lead(api, buyer_server, worker):
    """Ten leads offered first to `half` (10.00), which says no to every second post, then to
    `rest` (3.00), which takes what it is offered: half has 10 offers and 5 sales, rest the 5
    offers half refused. A return takes its price out of half's earnings per offer."""
    buyer_server.add("half").reject_every = 2
    buyer_server.add("rest")
    key = api.put_publisher("surge", commission_pct="10")
    api.put_buyer("half", buyer_server.url("half"), priority=1, price="10.00")
    api.put_buyer("rest", buyer_server.url("rest"), priority=2, price="3.00")
    api.settle_config()
    answers = [api.post_lead(key, {"lead_id": f"h{n}"}).json() for n in range(10)]
    assert [a["buyer_id"] for a in answers] == ["half", "rest"] * 5, answers
    for n in range(10):
        api.wait_settled(f"h{n}", "surge")
    resp = api.http.post(
        f"{api.base}/v1/admin/leads/h0/return?publisher_id=surge", json={"reason": "bad"}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text

    def shown(row: dict) -> tuple:
        return row["offers"], row["accept_rate"], row["sales"], row["revenue"], row["epl"]

    body = report(api, "buyer").json()
    rows = {r["key"]: shown(r) for r in body["rows"]}
    assert rows == {"half": (10, "0.5", 5, "40.00", "4.00"), "rest": (5, "1", 5, "15.00", "3.00")}
    assert shown(body["totals"]) == (15, "0.667", 10, "55.00", "3.67")
    (publisher,) = report(api, "publisher").json()["rows"]
    assert shown(publisher) == (15, "0.667", 10, "55.00", "3.67")


def test_an_attempt_that_never_reached_its_buyer_is_no_offer(api):
    """Each outcome of a lead's attempts in its buyer's row: every one an offer but an open
    circuit's (the buyer was never asked; nor is it when its post cannot be built, a skip that
    routing keeps out of the attempts)."""
    tried = [
        ("open", "circuit_open"),
        ("slow", "timeout"),
        ("broken", "error"),
        ("lost", "unknown"),
        ("no", "rejected"),
        ("yes", "accepted"),
    ]
    item = SettlementItem(
        publisher_id="surge",
        lead_id="t1",
        status=LeadStatus.SOLD,
        buyer_id="yes",
        price="8.00",
        payout="0.80",
        attempts=tuple({"buyer_id": b, "outcome": o, "ms": 5} for b, o in tried),
        skipped=(),
        payload="{}",
        received_at=TODAY.isoformat(),
    )
    with db.connection_context():
        assert ledger.settle([item]) == 1
    body = report(api, "buyer").json()
    offered = {r["key"]: (r["offers"], r["accept_rate"], r["epl"]) for r in body["rows"] if r["offers"]}
    assert offered == {
        "slow": (1, "0", "0.00"),
        "broken": (1, "0", "0.00"),
        "lost": (1, "0", "0.00"),
        "no": (1, "0", "0.00"),
        "yes": (1, "1", "8.00"),
    }
    assert (body["totals"]["offers"], body["totals"]["accept_rate"], body["totals"]["epl"]) == (5, "0.2", "1.60")
