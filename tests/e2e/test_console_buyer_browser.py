"""A buyer's console page in a real headless Chromium, against gunicorn, the RQ worker, Redis
and the database: its figures as the report has them, its circuit's health, "Send a test
lead" (the sample, then a lead that is no JSON, then the buyer saying no), and the list's
"Pause selected" / "Resume selected". Screenshots land in $FG_SCREENSHOTS when set
(scripts/screenshots), else in the test's tmp_path."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from testkit.browser import Page
from testkit.servers import BuyerServer
from tests.conftest import Api
from tests.e2e.conftest import log_in
from tests.e2e.test_console_forms_browser import Person

pytestmark = pytest.mark.e2e

BUYER, OTHER, PUBLISHER = "acme", "zen", "surge"


def test_a_buyers_page_and_its_test_lead_as_a_person_uses_them(
    web_api: Api, worker: object, buyer_server: BuyerServer, page: Page, tmp_path: Path
):
    shots = Path(os.environ.get("FG_SCREENSHOTS") or tmp_path).resolve()
    shots.mkdir(parents=True, exist_ok=True)
    stub = buyer_server.add(BUYER)
    buyer_server.add(OTHER)
    key = web_api.put_publisher(PUBLISHER)
    web_api.put_buyer(BUYER, buyer_server.url(BUYER), price="6.00", caps={"daily": 50})
    web_api.put_buyer(OTHER, buyer_server.url(OTHER), priority=2)
    web_api.settle_config()
    for n in range(3):
        assert web_api.post_lead(key, {"lead_id": f"b-{n}"}).json()["buyer_id"] == BUYER
    for n in range(3):
        web_api.wait_settled(f"b-{n}", PUBLISHER)
    person = Person(page, web_api)
    log_in(page, web_api.base)

    person.goto(f"/ops/buyers/{BUYER}")
    today = datetime.now(timezone.utc).date().isoformat()
    params = {"from": today, "to": today, "group_by": "buyer"}
    row = next(r for r in web_api.get("/v1/admin/reports/leads", params=params).json()["rows"] if r["key"] == BUYER)
    shown = '#figures tr[data-period="today"]'
    for name in ("offers", "accept-rate", "sales", "revenue", "epl"):
        assert page.attr(shown, f"data-{name}") == str(row[name.replace("-", "_")]), name
    assert (row["offers"], row["sales"], row["revenue"], row["epl"]) == (3, 3, "18.00", "6.00")
    assert sum(int(n or 0) for n in page.attrs("#buyer-chart g.hour", "data-sales")) == 3
    assert (page.text("#buyer-state .breaker") or "").strip() == "circuit: healthy"
    assert (page.text('#caps [data-cap="daily"] ~ .num') or "").strip() == "3 / 50"
    page.screenshot(shots / "34-buyer.png")

    # the sample lead: posted marked as a test, the answer shown, nothing sold
    person.submit("#send-test-lead", 200)
    result = "#test-lead-result"
    assert (page.attr(result, "data-sent"), page.attr(result, "data-outcome")) == ("post", "accepted")
    assert page.attr(result, "data-status") == "200" and '"accepted": true' in (page.text(f"{result} pre") or "")
    assert stub.received[-1]["headers"]["X-Floodgate-Test"] == "1"
    assert stub.received[-1]["body"]["lead"]["email"] == "test.lead@example.com"

    # a lead that is no JSON: refused beside the field, as typed, nothing sent
    posts = len(stub.received)
    page.fill("#test-lead-json", '{"email": ')
    person.submit("#send-test-lead", 400)
    assert person.errors() == ["lead"] and page.evaluate("document.querySelector('#test-lead-json').value") == (
        '{"email": '
    )
    assert len(stub.received) == posts

    # the buyer says no
    stub.mode = "reject"
    page.fill("#test-lead-json", '{"lead_id": "t-no", "email": "no@example.com"}')
    person.submit("#send-test-lead", 200)
    assert page.attr(result, "data-outcome") == "rejected" and stub.received[-1]["body"]["lead_id"] == "t-no"
    page.screenshot(shots / "35-buyer-test-lead.png")
    sold = web_api.get("/v1/admin/leads", params={"buyer_id": BUYER}).json()["items"]
    assert len(sold) == 3  # the test leads are in no ledger

    # the list: both ticked, paused in one post, then resumed
    person.goto("/ops/buyers")
    for buyer_id in (BUYER, OTHER):
        page.check(f'#buyers input[name=buyer_id][value="{buyer_id}"]')
    person.submit("#pause-selected", 200)
    assert page.attr("#selected-done", "data-action") == "pause"
    assert page.attrs("#buyers tbody tr", "data-active") == ["false", "false"]
    assert [web_api.get(f"/v1/admin/buyers/{b}").json()["active"] for b in (BUYER, OTHER)] == [False, False]
    page.screenshot(shots / "36-buyers-paused.png")
    page.check(f'#buyers input[name=buyer_id][value="{OTHER}"]')
    person.submit("#resume-selected", 200)
    assert page.attrs("#buyers tbody tr", "data-active") == ["false", "true"]
    person.submit("#resume-selected", 400)  # nothing ticked: nothing changed, and why
    assert "Tick 1 to" in (page.text("#selected-error") or "")
