"""Every form of the operator console (/ops) submitted in a real headless Chromium as a person
submits it, against gunicorn, the RQ worker, Redis and the database: the optional fields left
empty, a field wrong (refused beside it, the typed value kept, nothing changed; two wrong on
the new buyer's form, both listed above it at once), then right (done, and the admin API
agrees). Buyers new and edit, publishers new and edit, the lead
search, a lead's return, a payment's assign, an endpoint's replay, the report, the audit
filter and a buyer's statement month."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from testkit.browser import Page
from testkit.payments import deliver, encode, payload, without_payer
from testkit.servers import BuyerServer
from tests.conftest import Api
from tests.e2e.conftest import log_in, page_errors

pytestmark = pytest.mark.e2e

BUYER, PUBLISHER, LEAD = "lean", "lean-pub", "bl-1"


class Person:
    """The browser's tab on the console as an operator uses it, the admin API beside it."""

    def __init__(self, page: Page, api: Api):
        self.page, self.api = page, api

    def goto(self, path: str) -> None:
        assert self.page.goto(self.api.base + path) == 200, (path, self.page.status)

    def fill(self, values: dict[str, str]) -> None:
        for css, value in values.items():
            self.page.fill(css, value)

    def submit(self, css: str, status: int) -> None:
        """Submit the form (or click the button) `css`; the page that loads is answered
        `status`. A 4xx document is logged by Chromium as a failed load, which is no page
        error: that one line is taken off the page's errors; any other fails the test."""
        assert self.page.submit(css) == status, (css, self.page.status, self.page.url)
        if status >= 400:
            logged = f"the server responded with a status of {status} "
            mine = [e for e in self.page.console_errors if logged in e]
            assert mine, self.page.console_errors
            for line in mine:
                self.page.console_errors.remove(line)
        assert page_errors(self.page) == [], page_errors(self.page)

    def errors(self) -> list[str | None]:
        """The fields the page shows a refusal beside."""
        return self.page.attrs("[data-error-for]", "data-error-for")

    def notice(self) -> str:
        return (self.page.text(".flash") or "").strip()

    def path(self) -> str:
        return self.page.url.removeprefix(self.api.base)


def test_every_console_form_as_a_person_fills_it(web_api: Api, worker: object, buyer_server: BuyerServer, page: Page):
    person = Person(page, web_api)
    log_in(page, web_api.base)
    new_buyer(person, buyer_server)
    edit_buyer(person)
    key = new_and_edit_publisher(person)
    search_leads(person, key)
    return_the_lead(person)
    assign_a_payment(person)
    replay_an_endpoint(person)
    reports_and_audit(person)
    statement_month(person)


def new_buyer(p: Person, buyer_server: BuyerServer) -> None:
    """Only the required fields filled and two others wrong (a weight of 0, an acceptance rule
    that does not parse): both refused at once, listed above the form (each a link to its
    field) and beside each, what was typed kept, nothing created; both right: created, every
    optional field left empty its default."""
    buyer_server.add(BUYER)
    p.goto("/ops/buyers/new")
    required = {"#f-id": BUYER, "#f-name": "Lean", "#f-endpoint_url": buyer_server.url(BUYER), "#f-price": "4.00"}
    p.fill({**required, "#f-weight": "0", "#f-delivery-accept": "accepted =="})
    p.submit("#buyer-form", 400)
    assert p.errors() == ["weight", "delivery.accept"], p.errors()
    assert p.page.attrs("#form-errors li", "data-error-at") == ["weight", "delivery.accept"]
    assert p.page.attrs("#form-errors li a", "href") == ["#f-weight", "#f-delivery-accept"]
    assert "1" in (p.page.text('#form-errors li[data-error-at="weight"]') or "")
    assert p.page.attr("#f-delivery-accept", "value") == "accepted =="  # as typed
    assert p.page.attr("#f-price", "value") == "4.00"
    assert p.api.get(f"/v1/admin/buyers/{BUYER}").status_code == 404

    p.fill({"#f-weight": "2", "#f-delivery-accept": "accepted == `true`"})
    p.submit("#buyer-form", 200)
    assert p.path() == f"/ops/buyers/{BUYER}?notice=created" and p.notice() == "Created."
    assert p.page.text("#form-errors") is None
    got = p.api.get(f"/v1/admin/buyers/{BUYER}").json()
    assert (got["price"], got["priority"], got["timezone"], got["active"]) == ("4.00", 0, "UTC", True), got
    assert (got["weight"], got["delivery"]["accept"]) == (2, "accepted == `true`"), got
    assert got.get("billing") is None and not got.get("caps") and not got.get("states"), got
    assert got["schedule"] is None and got["dedupe"] is None and got["ping"] is None, got


def edit_buyer(p: Person) -> None:
    """The edit form as the page fills it; a priority of "²" (a digit to str.isdigit, not to
    the API) refused beside it; then 3: saved, the rest as it was."""
    before = p.api.get(f"/v1/admin/buyers/{BUYER}").json()
    p.fill({"#f-priority": "²"})
    p.submit("#buyer-form", 400)
    assert p.errors() == ["priority"], p.errors()
    assert p.page.attr("#f-priority", "value") == "²"
    assert p.api.get(f"/v1/admin/buyers/{BUYER}").json() == before

    p.fill({"#f-priority": "3"})
    p.submit("#buyer-form", 200)
    assert p.path() == f"/ops/buyers/{BUYER}?notice=saved" and p.notice() == "Saved."
    after = p.api.get(f"/v1/admin/buyers/{BUYER}").json()
    assert after["priority"] == 3
    for name in ("name", "price", "timezone", "active", "endpoint_url", "billing", "caps"):
        assert after.get(name) == before.get(name), name


def new_and_edit_publisher(p: Person) -> str:
    """A new publisher with its id mistyped, then right, the API key left empty (made and
    shown once); its edit form with a cap of "--5", then 100. The publisher's key."""
    p.goto("/ops/publishers/new")
    p.fill({"#f-id": "lean pub", "#f-name": "Lean Pub"})
    p.submit("#publisher-form", 400)
    assert p.errors() == ["id"], p.errors()
    assert p.api.get("/v1/admin/publishers").json()["items"] == []

    p.fill({"#f-id": PUBLISHER})
    p.submit("#publisher-form", 201)
    key = (p.page.text("code.secret") or "").strip()
    assert key.startswith("pk_"), key
    assert p.api.get(f"/v1/admin/publishers/{PUBLISHER}").json()["api_key_hint"] == "…" + key[-4:]

    p.fill({"#f-caps-hourly": "--5"})
    p.submit("#publisher-form", 400)
    assert p.errors() == ["caps.hourly"], p.errors()
    assert p.page.attr("#f-caps-hourly", "value") == "--5"
    p.fill({"#f-caps-hourly": "100"})
    p.submit("#publisher-form", 200)
    assert p.path() == f"/ops/publishers/{PUBLISHER}?notice=saved" and p.notice() == "Saved."
    got = p.api.get(f"/v1/admin/publishers/{PUBLISHER}").json()
    assert got["caps"] == {"hourly": 100} and got["api_key_hint"] == "…" + key[-4:], got  # the key kept
    return key


def search_leads(p: Person, key: str) -> None:
    """A sale to the buyer; the search with the buyer filled in and every other field left
    empty (status "any") finds it; a `since` of "yesterday" is refused on the page; an
    instant an hour ago finds it again."""
    p.api.settle_config()
    sold = p.api.post_lead(key, {"lead_id": LEAD})
    assert sold.status_code == 200 and sold.json().get("buyer_id") == BUYER, sold.text
    p.api.wait_settled(LEAD, PUBLISHER)

    p.goto("/ops/leads")
    p.fill({"#lead-search input[name=buyer_id]": BUYER})
    p.submit("#lead-search", 200)
    assert p.path() == f"/ops/leads?publisher_id=&buyer_id={BUYER}&status=&since=&until=", p.path()
    assert p.page.attrs("#leads tbody tr", "data-lead") == [LEAD]
    assert p.page.text("#lead-search ~ .errors") is None

    p.fill({"#lead-search input[name=since]": "yesterday"})
    p.submit("#lead-search", 400)
    assert "since: must be an ISO 8601 instant" in (p.page.text(".errors") or "")
    assert p.page.attr("#lead-search input[name=since]", "value") == "yesterday"
    assert p.page.attrs("#leads tbody tr[data-lead]", "data-lead") == []

    an_hour_ago = (datetime.now(timezone.utc) - timedelta(hours=1)).replace(microsecond=0).isoformat()
    p.fill({"#lead-search input[name=since]": an_hour_ago})
    p.submit("#lead-search", 200)
    assert p.page.attrs("#leads tbody tr", "data-lead") == [LEAD]


def return_the_lead(p: Person) -> None:
    """A reason longer than the ledger keeps: refused on the trace, the lead still sold; the
    reason left empty: returned."""
    p.submit(f'tr[data-lead="{LEAD}"] a', 200)
    p.page.fill("#reason", "x" * 501)  # past the field's maxlength: what a script could send
    p.submit("#return-form", 400)
    assert "reason" in (p.page.text(".errors") or p.page.text("body") or "")
    assert p.api.get(f"/v1/admin/leads/{LEAD}").json()["status"] == "sold"

    p.page.fill("#reason", "")
    p.submit("#return-form", 200)
    assert p.notice().startswith("Returned"), p.notice()
    got = p.api.get(f"/v1/admin/leads/{LEAD}").json()
    assert (got["status"], got["return_reason"]) == ("returned", None), got


def assign_a_payment(p: Person) -> None:
    """A payment that named no wallet; "two words" for a wallet refused on its row; then one."""
    raw = encode(without_payer("standard", payload("standard", "std-forms-1", 2_500)))
    assert deliver(p.api, "standard", raw).json() == {"status": "unattributed"}
    p.goto("/ops/payments")
    row = 'tr[data-payment="standard:std-forms-1"]'
    p.fill({f"{row} input[name=customer]": "two words"})
    p.submit(f"{row} form", 400)
    assert p.errors() == ["standard:std-forms-1"], p.errors()
    assert p.api.get("/v1/admin/payments/standard/std-forms-1").json()["status"] == "unattributed"

    p.fill({f"{row} input[name=customer]": "acct-lean"})
    p.submit(f"{row} form", 200)
    assert p.path() == "/ops/payments?notice=assigned" and p.notice().startswith("Assigned"), p.notice()
    got = p.api.get("/v1/admin/payments/standard/std-forms-1").json()
    assert (got["status"], got["customer"]) == ("credited", "acct-lean"), got


def replay_an_endpoint(p: Person) -> None:
    """An endpoint's replay with "last week" for a time: refused on its row; emptied: refused
    (a replay needs a time); the time the page fills in: replaying."""
    endpoint = {"url": "https://app.example/hooks", "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
    resp = p.api.http.put(f"{p.api.base}/v1/admin/event-endpoints/app-forms", json=endpoint, headers=p.api.admin)
    assert resp.status_code == 200, resp.text
    p.goto("/ops/events")
    form = '#event-endpoints tr[data-endpoint="app-forms"] form.replay'
    day_ago = p.page.attr(f"{form} input[name=since]", "value")
    assert day_ago
    for wrong in ("last week", ""):
        p.fill({f"{form} input[name=since]": wrong})
        p.submit(form, 400)
        assert p.errors() == ["app-forms"], p.errors()
        assert "since" in (p.page.text('[data-error-for="app-forms"]') or "")
    p.fill({f"{form} input[name=since]": day_ago})
    p.submit(form, 200)
    assert p.path() == "/ops/events?notice=replaying" and p.notice().startswith("Replaying"), p.notice()


def reports_and_audit(p: Person) -> None:
    """The report with both days emptied: the last seven; a month 13: refused on the page;
    from yesterday: the sale's figures. The audit log's kind left at "any": every kind."""
    today = datetime.now(timezone.utc).date()
    p.goto("/ops/reports")
    p.fill({"#report-form input[name=from]": "", "#report-form input[name=to]": ""})
    p.submit("#report-form", 200)
    assert p.page.attr("#report-form input[name=from]", "value") == (today - timedelta(days=6)).isoformat()
    assert p.page.attr("#report-form input[name=to]", "value") == today.isoformat()

    p.fill({"#report-form input[name=from]": f"{today.year}-13-01"})
    p.submit("#report-form", 400)
    assert "from: must be a date" in (p.page.text(".errors") or "")
    assert p.page.text("#report") is None

    yesterday = today - timedelta(days=1)  # the sale's day, even when the clock passed midnight since
    p.fill({"#report-form input[name=from]": yesterday.isoformat()})
    p.submit("#report-form", 200)
    totals = [t.strip() for t in p.page.texts("#report-totals th")]
    assert totals[1:5] == ["1", "1", "0", "1"], totals  # leads, sold, unsold, returned

    p.goto("/ops/audit?entity=buyer")
    assert set(p.page.attrs("table.audit tbody tr", "data-action")) == {"buyer.create", "buyer.update"}
    p.page.fill("form.filters select[name=entity]", "")
    p.submit("form.filters", 200)
    actions = p.page.attrs("table.audit tbody tr", "data-action")
    for action in ("buyer.create", "publisher.put", "lead.returned", "payment.assign"):
        assert action in actions, (action, actions)


def statement_month(p: Person) -> None:
    """The buyer billed on credit from its edit form's billing fields; its statement's month
    as "2026-13": refused above the statement; emptied: this month's."""
    p.goto(f"/ops/buyers/{BUYER}")
    credit = {"#f-billing-account": "acct-lean", "#f-billing-currency": "USD", "#f-billing-credit_limit": "100.00"}
    p.fill({"#f-billing-mode": "credit", **credit})
    p.submit("#buyer-form", 200)
    billing = p.api.get(f"/v1/admin/buyers/{BUYER}").json()["billing"]
    assert billing == {"mode": "credit", "account": "acct-lean", "currency": "USD", "credit_limit": "100.00"}
    month_form = 'form.filters:has(input[name="month"])'
    p.fill({f"{month_form} input[name=month]": "2026-13"})
    p.submit(month_form, 400)
    assert p.errors() == ["month"], p.errors()
    assert p.page.attr(f"{month_form} input[name=month]", "value") == "2026-13"
    this_month = datetime.now(timezone.utc).strftime("%Y-%m")
    p.fill({f"{month_form} input[name=month]": ""})
    p.submit(month_form, 200)
    assert p.page.attr(f"{month_form} input[name=month]", "value") == this_month
    assert p.page.text("#statement") is not None and p.errors() == []
