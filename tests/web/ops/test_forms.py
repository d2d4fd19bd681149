"""The console's buyer and publisher forms (webhooks/web/ops/forms.py): every refusal of a form
at once, listed above it (each a link to its field) and beside its field; what was typed kept,
but a secret; structured fields for schedule, dedupe, billing, delivery and ping read into the
JSON the API takes and shown back from it; states checked as the API checks them; an analyst
refused every change."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import pytest
from werkzeug.datastructures import MultiDict

from tests.web.ops.conftest import post
from tests.web.people.test_users import SAME_SITE, csrf, user_client
from webhooks.storage.records.models import Buyer
from webhooks.web.ops import buyers as buyer_forms
from webhooks.web.ops import forms

BUYER = {"id": "acme", "name": "Acme", "endpoint_url": "https://buyer.example/leads", "price": "12.50"}
SECRET = "sk_live_0123456789abcdef"


def field_errors(text: str) -> dict[str, str]:
    """The refusals shown beside their fields, by field."""
    return {name: html.unescape(why) for name, why in re.findall(r'data-error-for="([^"]+)">([^<]+)<', text)}


def listed_errors(text: str) -> dict[str, str]:
    """The refusals listed above the form, by field, each with the id it links to."""
    found = re.findall(r'<li data-error-at="([^"]+)"><a href="#([^"]+)">', text)
    return dict(found)


class FormReader(HTMLParser):
    """A form's fields as a browser sends them: text inputs, ticked boxes, the selected option
    (else the first), textareas, in the page's order."""

    def __init__(self, form_id: str):
        super().__init__()
        self.form_id, self.inside, self.sent = form_id, False, []
        self.select: str | None = None
        self.options: list[tuple[str, bool]] = []
        self.textarea: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.inside = a.get("id") == self.form_id
        if not self.inside:
            return
        if tag == "input" and a.get("name") and a.get("name") != "csrf_token":
            if a.get("type") != "checkbox" or "checked" in a:
                self.sent.append((a["name"], a.get("value") or ""))
        elif tag == "select":
            self.select, self.options = a["name"], []
        elif tag == "option" and self.select:
            self.options.append((a.get("value"), "selected" in a))
        elif tag == "textarea":
            self.textarea = a["name"]
            self.sent.append((a["name"], ""))

    def handle_data(self, data):
        if self.textarea:
            name, text = self.sent[-1]
            self.sent[-1] = (name, text + data)
        if self.select and self.options and self.options[-1][0] is None:
            self.options[-1] = (data, self.options[-1][1])

    def handle_endtag(self, tag):
        if tag == "form":
            self.inside = False
        elif tag == "textarea":
            self.textarea = None
        elif tag == "select" and self.select:
            chosen = [value for value, selected in self.options if selected] or [self.options[0][0]]
            self.sent.append((self.select, chosen[0]))
            self.select = None


def as_shown(text: str, form_id: str) -> list[tuple[str, str]]:
    reader = FormReader(form_id)
    reader.feed(text)
    return reader.sent


def test_every_refusal_of_a_form_is_shown_at_once_above_it_and_beside_each_field(api, browser):
    typed = {
        **BUYER,
        "name": "",
        "price": "twelve",
        "states": "TX, ZZ, texas",
        "schedule.tue": "9am",
        "schedule.wed": "09:00-25:00",
        "billing.mode": "credit",
        "billing.account": "acct-1",
        "billing.currency": "USD",
        "delivery.accept_regex": "(",
        "weight": "0",
    }
    resp = post(api, browser, "/ops/buyers", typed)
    assert resp.status_code == 400
    beside = field_errors(resp.text)
    assert set(beside) == {
        "name",
        "price",
        "states",
        "schedule.tue",
        "schedule.wed",
        "billing.credit_limit",
        "delivery.accept_regex",
        "weight",
    }
    assert beside["name"] == "is required"
    assert beside["states"] == "'ZZ', 'texas': not a US state or territory code (two letters, e.g. TX for Texas)"
    assert "09:00-17:00" in beside["schedule.tue"] and "25:00" in beside["schedule.wed"]
    listed = listed_errors(resp.text)
    assert set(listed) == set(beside)  # the list above the form names them all ...
    assert listed["billing.credit_limit"] == "f-billing-credit_limit"  # ... each linking to its field's id
    assert 'id="f-billing-credit_limit"' in resp.text
    assert resp.text.index('id="form-errors"') < resp.text.index('id="buyer-form"')
    assert 'data-errors="8"' in resp.text and "This form has 8 errors" in resp.text
    # every value typed is kept
    for name in ("price", "states", "schedule.tue", "schedule.wed", "billing.account", "delivery.accept_regex"):
        assert f'name="{name}" value="{html.escape(typed[name])}"' in resp.text, name
    assert "<option selected>credit</option>" in resp.text
    assert api.get("/v1/admin/buyers").json()["items"] == []


def test_a_typed_secret_is_never_written_back_and_asked_for_again(api, browser):
    typed = {**BUYER, "price": "twelve", "delivery.headers": f"X-Api-Key: {SECRET}"}
    resp = post(api, browser, "/ops/buyers", typed)
    assert resp.status_code == 400 and SECRET not in resp.text and SECRET[-4:] not in resp.text
    assert field_errors(resp.text)["delivery.headers"] == forms.RETYPE
    assert post(api, browser, "/ops/buyers", {**typed, "price": "12.50"}).status_code == 303
    # the edit page shows the header redacted; sent back so, it is kept
    page = browser[0].get(api.base + "/ops/buyers/acme").text
    assert SECRET not in page and f"X-Api-Key: ****{SECRET[-4:]}" in page
    refused = post(api, browser, "/ops/buyers/acme", [*as_shown(page, "buyer-form"), ("price", "x")])
    assert refused.status_code == 400 and "delivery.headers" not in field_errors(refused.text)
    assert SECRET not in refused.text


def test_structured_fields_read_into_the_apis_json_and_show_it_back(api, browser):
    typed = [
        *BUYER.items(),
        ("schedule.mon", "09:00-12:00, 13:00-17:00"),
        ("schedule.tue", "08:30–24:00"),
        ("schedule.sun", "closed"),
        ("dedupe.fields", ""),
        ("dedupe.fields", "email"),
        ("dedupe.fields", "phone"),
        ("dedupe.days", "14"),
        ("billing.mode", "credit"),
        ("billing.account", "acct-1"),
        ("billing.currency", "usd"),
        ("billing.credit_limit", "250.00"),
        ("billing.low_balance", ""),
        ("delivery.method", "PUT"),
        ("delivery.format", "form"),
        ("delivery.headers", f"X-Api-Key: {SECRET}\r\nX-Source: floodgate\r\n"),
        ("delivery.accept", "result == 'success'"),
        ("delivery.accept_regex", ""),
        ("delivery.fields", '{"email": "{{ lead.email }}"}'),
        ("ping.url", "https://buyer.example/ping"),
        ("ping.bid", "price"),
        ("ping.min_bid", "3"),
        ("ping.fields", ""),
        ("states", "tx ok"),
    ]
    assert post(api, browser, "/ops/buyers", typed).status_code == 303
    got = api.get("/v1/admin/buyers/acme").json()
    assert got["schedule"] == {"mon": [["09:00", "12:00"], ["13:00", "17:00"]], "tue": [["08:30", "24:00"]], "sun": []}
    assert got["dedupe"] == {"fields": ["email", "phone"], "days": 14}
    assert got["billing"] == {"mode": "credit", "account": "acct-1", "currency": "USD", "credit_limit": "250.00"}
    assert got["delivery"] == {
        "method": "PUT",
        "format": "form",
        "headers": {"X-Api-Key": f"****{SECRET[-4:]}", "X-Source": "****"},
        "accept": "result == 'success'",
        "fields": {"email": "{{ lead.email }}"},
    }
    assert got["ping"] == {"url": "https://buyer.example/ping", "fields": {}, "bid": "price", "min_bid": "3.00"}
    assert got["states"] == ["OK", "TX"]
    stored_headers = Buyer.get_by_id("acme").delivery
    assert SECRET in stored_headers

    # the page shows each structured field from the stored object, and sent back unchanged
    # it changes nothing (no audit row of a change either)
    page = browser[0].get(api.base + "/ops/buyers/acme").text
    shown = MultiDict(as_shown(page, "buyer-form"))
    assert shown["schedule.mon"] == "09:00-12:00, 13:00-17:00" and shown["schedule.sun"] == "closed"
    assert shown["schedule.wed"] == "" and shown.getlist("dedupe.fields") == ["", "email", "phone"]
    assert (shown["billing.mode"], shown["billing.currency"], shown["delivery.method"]) == ("credit", "USD", "PUT")
    assert shown == MultiDict(as_shown_of(got))
    assert post(api, browser, "/ops/buyers/acme", list(shown.items(multi=True))).status_code == 303
    again = api.get("/v1/admin/buyers/acme").json()
    assert {k: v for k, v in again.items() if k not in ("updated_at", "usage")} == {
        k: v for k, v in got.items() if k not in ("updated_at", "usage")
    }
    assert Buyer.get_by_id("acme").delivery == stored_headers

    # emptied: a day closes, a header line removed is gone, no billing mode is not billed,
    # no ping URL no ping, no dedupe box no dedupe; every delivery field empty: the default
    changed = MultiDict(shown)
    changed.setlist("schedule.tue", [""])
    changed.setlist("delivery.headers", [f"X-Api-Key: ****{SECRET[-4:]}"])
    changed.setlist("billing.mode", [""])
    changed.setlist("ping.url", [""])
    changed.setlist("dedupe.fields", [""])
    assert post(api, browser, "/ops/buyers/acme", list(changed.items(multi=True))).status_code == 303
    got = api.get("/v1/admin/buyers/acme").json()
    assert got["schedule"] == {"mon": [["09:00", "12:00"], ["13:00", "17:00"]], "sun": []}
    assert got["delivery"]["headers"] == {"X-Api-Key": f"****{SECRET[-4:]}"}
    assert (got["billing"], got["ping"], got["dedupe"]) == (None, None, None)
    for name in ("delivery.method", "delivery.format", "delivery.headers", "delivery.accept", "delivery.fields"):
        changed.setlist(name, [""])
    assert post(api, browser, "/ops/buyers/acme", list(changed.items(multi=True))).status_code == 303
    assert api.get("/v1/admin/buyers/acme").json()["delivery"] is None


def as_shown_of(buyer: dict) -> list[tuple[str, str]]:
    """The edit form's fields as forms.shown fills them for `buyer`, as a browser sends them."""
    values = forms.shown(buyer_forms.FIELDS, buyer)
    sent: list[tuple[str, str]] = []
    for f in buyer_forms.FIELDS:
        value = values[f.name]
        if f.kind == forms.CHECKBOX:
            sent += [(f.name, ""), *([(f.name, "on")] if value else [])]
        elif f.kind == forms.CHOICES:
            sent += [(f.name, ""), *((f.name, choice) for choice in value.split(", ") if choice)]
        elif f.kind == forms.SELECT and not value:
            sent.append((f.name, "" if f.blank else f.choices[0]))
        else:
            sent.append((f.name, value))
    return sent


def test_a_form_read_refuses_what_it_cannot_read_before_the_api_sees_it():
    form = MultiDict(
        [
            ("schedule.mon", "9 to 5"),
            ("delivery.headers", "X-Api-Key sk"),
            ("dedupe.fields", "address"),
            ("delivery.fields", "{"),
            ("name", ""),
        ]
    )
    reading = forms.read(buyer_forms.FIELDS, form)
    assert set(reading.errors) == {"schedule.mon", "delivery.headers", "dedupe.fields", "delivery.fields", "name"}
    assert "name" not in reading.body and reading.body.get("schedule") is None
    assert reading.errors["delivery.headers"] == "line 1 is not Name: value"  # the secret not quoted back
    twice = forms.read(buyer_forms.FIELDS, MultiDict([("delivery.headers", "A: 1\nA: 2")]))
    assert twice.errors == {"delivery.headers": "names 'A' twice"}


@pytest.mark.parametrize(
    "named, holder",
    [
        ("delivery.headers.X-Key", "delivery.headers"),
        ("schedule.tue[0]", "schedule.tue"),
        ("billing", "billing.mode"),
        ("ping", "ping.url"),
        ("body", "_form"),
    ],
)
def test_a_refusal_is_shown_beside_the_field_holding_what_it_names(named, holder):
    assert forms._holder(buyer_forms.FIELDS, named) == holder


def test_a_publisher_form_shows_every_refusal_at_once(api, browser):
    typed = {"id": "no spaces", "name": "", "rate_limit.per_second": "0", "sell.max_sales": "99", "api_key": "short"}
    resp = post(api, browser, "/ops/publishers", typed)
    assert resp.status_code == 400
    assert set(field_errors(resp.text)) == {"id", "name", "rate_limit.per_second", "sell.max_sales", "api_key"}
    assert set(listed_errors(resp.text)) == set(field_errors(resp.text)) and 'value="short"' not in resp.text
    fine = {"id": "pub-f", "name": "F", "rate_limit.per_second": "5", "rate_limit.burst": ""}
    assert post(api, browser, "/ops/publishers", fine).status_code == 201
    assert api.get("/v1/admin/publishers/pub-f").json()["rate_limit"] == {"per_second": 5, "burst": 5}
    bad = {"name": "F", "fields": '{"state": {"type": "enum", "values": ["Texas"]}}', "payout_hold_days": "-1"}
    resp = post(api, browser, "/ops/publishers/pub-f", bad)
    assert resp.status_code == 400 and set(field_errors(resp.text)) == {"fields", "payout_hold_days"}
    assert resp.text.index('id="form-errors"') < resp.text.index('id="publisher-form"')


def test_an_analyst_changes_nothing_through_the_forms(app, api):
    api.put_buyer("acme", "https://buyer.example/leads")
    api.put_publisher("pub-a")
    analyst = user_client(app, api, "ana@example.com", "analyst")
    token = csrf(analyst, "/ops/buyers/acme")
    for path, fields in (
        ("/ops/buyers", BUYER),
        ("/ops/buyers/acme", {"name": "Renamed", "states": "TX"}),
        ("/ops/publishers", {"id": "pub-b", "name": "B"}),
        ("/ops/publishers/pub-a", {"name": "Renamed"}),
    ):
        resp = analyst.post(path, data={**fields, "csrf_token": token}, headers=SAME_SITE)
        assert resp.status_code == 403, (path, resp.status_code)
    assert api.get("/v1/admin/buyers/acme").json()["name"] != "Renamed"
    assert api.get("/v1/admin/publishers/pub-a").json()["name"] != "Renamed"
    assert [b["id"] for b in api.get("/v1/admin/buyers").json()["items"]] == ["acme"]


def test_each_bad_member_of_billing_schedule_and_returns_is_named(api, browser):
    typed = {
        **BUYER,
        "billing.mode": "credit",
        "billing.currency": "XYZ1",
        "schedule.wed": "09:00-25:00",
        "schedule.thu": "18:00-09:00",
        "returns.max_pct": "101",
        "returns.period_days": "0",
        "returns.review": "auto",
    }
    resp = post(api, browser, "/ops/buyers", typed)
    assert resp.status_code == 400
    assert set(field_errors(resp.text)) == {
        "billing.account",
        "billing.currency",
        "schedule.wed",
        "schedule.thu",
        "returns.max_pct",
        "returns.period_days",
    }


def test_a_billing_the_wallets_other_buyer_refuses_is_shown_on_the_form(api, browser, buyer_server):
    billing = {"mode": "credit", "account": "shared-w", "currency": "USD", "credit_limit": "100.00"}
    api.put_buyer("first", buyer_server.url("first"), billing=billing)
    typed = {
        **BUYER,
        "billing.mode": "credit",
        "billing.account": "shared-w",
        "billing.currency": "USD",
        "billing.credit_limit": "50.00",
    }
    resp = post(api, browser, "/ops/buyers", typed)
    assert resp.status_code == 400 and resp.headers["Content-Type"].startswith("text/html")
    assert set(field_errors(resp.text)) & {"billing.account", "billing.credit_limit"}, field_errors(resp.text)
    assert 'id="form-errors"' in resp.text and api.get("/v1/admin/buyers/acme").status_code == 404
