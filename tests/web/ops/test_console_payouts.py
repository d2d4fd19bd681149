"""The console's publisher page: its held and payable payouts, the hold in its form, and its
month's payout statement with the CSV of every line (docs/leads.md "Payout holds")."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from decimal import Decimal

from webhooks.caps import leases
from webhooks.leads.accounting import ledger
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db

from .conftest import post


def _sell(publisher_id: str, lead_id: str, sold_at: datetime) -> None:
    out = Outcome(
        status="sold", buyer_id="acme", price=Decimal("20.00"), sold_at=sold_at, lease=leases.Lease("acme", "l", ())
    )
    pub = PublisherRule(id=publisher_id, active=True, payout_pct=Decimal("10"))
    item = settlement.make_item(
        publisher=pub, lead_id=lead_id, outcome=out, payload="{}", received_at=sold_at, request_id=None
    )
    with db.connection_context():
        ledger.settle([item])


def test_the_publisher_page_shows_held_and_payable_and_the_statement(api, browser):
    api.put_publisher("surge", commission_pct="10")
    resp = post(api, browser, "/ops/publishers/surge", {"name": "Surge", "payout_hold_days": "7"})
    assert resp.status_code in (302, 303), resp.text[:2000]
    assert api.get("/v1/admin/publishers/surge").json()["payout_hold_days"] == 7
    now = datetime.now(timezone.utc)
    _sell("surge", "held-1", now)
    page = browser[0].get(api.base + "/ops/publishers/surge")
    assert page.status_code == 200
    assert 'data-held="2.00" data-payable="0.00"' in page.text
    assert "held-1" in page.text and 'data-payable="0.00"' in page.text
    month = now.strftime("%Y-%m")
    assert f"/ops/publishers/surge/statement.csv?month={month}" in page.text
    got = browser[0].get(api.base + f"/ops/publishers/surge/statement.csv?month={month}")
    assert got.status_code == 200 and got.headers["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(got.text)))
    assert [row[1:5] for row in rows[1:]] == [["held", "held-1", "acme", "2.00"]]
    resp = post(api, browser, "/ops/publishers/surge", {"name": "Surge", "payout_hold_days": ""})
    assert api.get("/v1/admin/publishers/surge").json()["payout_hold_days"] == 0  # emptied: the default
    resp = post(api, browser, "/ops/publishers/surge", {"name": "Surge", "payout_hold_days": "400"})
    assert resp.status_code == 400 and 'data-error-for="payout_hold_days"' in resp.text


def test_a_month_the_publisher_page_cannot_show_is_a_refusal_on_the_page(api, browser):
    api.put_publisher("surge")
    resp = browser[0].get(api.base + "/ops/publishers/surge", params={"month": "2026-13"})
    assert resp.status_code == 400 and 'data-error-for="month"' in resp.text
    assert 'id="statement"' in resp.text  # this month's, below the refusal
    assert browser[0].get(api.base + "/ops/publishers/nope/statement.csv").status_code == 404
