"""The console's input is answered 4xx, never 500 (docs/api.md "Fifth round: the seams"): its
JSON fields are read by the API's strict parser (nesting, duplicate keys, NaN), its number
fields take ASCII digits only, an instant at the calendar's edge is a refusal shown on the
page; and a form's field left empty is no filter."""

from __future__ import annotations

import re

import pytest

from tests.web.ops.conftest import post


def test_an_instant_at_the_calendars_edge_on_the_console_is_shown_as_a_refusal(api, browser):
    resp = browser[0].get(api.base + "/ops/leads", params={"since": "0001-01-01T00:00:00+14:00"})
    assert resp.status_code == 400 and "since" in resp.text


def deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize(
    "field, text, message",
    [
        ("delivery.fields", deep(20_000), "nested deeper"),
        ("ping.fields", deep(100), "nested deeper"),
        ("delivery.fields", '{"email": "{{ lead.email }}", "email": "x"}', "duplicate key"),
        ("ping.fields", '{"bid": NaN}', "NaN"),
    ],
)
def test_a_console_json_field_is_read_by_the_apis_strict_parser(api, browser, buyer_server, field, text, message):
    api.put_buyer("acme", buyer_server.url("acme"))
    resp = post(api, browser, "/ops/buyers/acme", {field: text})
    assert resp.status_code == 400, resp.text[:300]
    assert f'data-error-for="{field}"' in resp.text and message in resp.text
    assert api.get("/v1/admin/buyers/acme").json().get(field.partition(".")[0]) is None  # nothing saved


def test_a_new_buyers_form_with_a_deep_json_field_is_refused_beside_it(api, browser):
    fields = {"id": "deep", "name": "Deep", "endpoint_url": "https://buyer.example/leads", "price": "1.00"}
    resp = post(api, browser, "/ops/buyers", {**fields, "delivery.fields": deep(20_000)})
    assert resp.status_code == 400 and 'data-error-for="delivery.fields"' in resp.text
    assert api.get("/v1/admin/buyers/deep").status_code == 404


def as_a_browser_sends(fields, filled: dict[str, str]) -> list[tuple[str, str]]:
    """Every field of a console form as a browser posts it: the ones left empty as "", a
    checkbox as its hidden "" (and "on" when ticked), a group of boxes as its hidden "", a
    select as its first choice (its empty one when it has one)."""
    sent: list[tuple[str, str]] = []
    for f in fields:
        if f.kind == "checkbox":
            sent += [(f.name, ""), *([(f.name, "on")] if filled.get(f.name) else [])]
        elif f.kind == "choices":
            sent += [(f.name, ""), *((f.name, choice) for choice in filled.get(f.name, "").split(", ") if choice)]
        elif f.kind == "select":
            sent.append((f.name, filled.get(f.name, "" if f.blank else f.choices[0])))
        else:
            sent.append((f.name, filled.get(f.name, "")))
    return sent


def test_a_buyer_form_with_its_optional_fields_left_empty_creates_and_saves(api, browser):
    from webhooks.web.ops import buyers

    required = {"id": "lean", "name": "Lean", "endpoint_url": "https://buyer.example/leads", "price": "3.00"}
    resp = post(api, browser, "/ops/buyers", as_a_browser_sends(buyers.NEW_FIELDS, {**required, "active": "on"}))
    assert resp.status_code == 303, resp.text[:2000]
    got = api.get("/v1/admin/buyers/lean").json()
    assert (got["price"], got["priority"], got["timezone"], got["active"]) == ("3.00", 0, "UTC", True)
    del required["id"]
    resp = post(api, browser, "/ops/buyers/lean", as_a_browser_sends(buyers.FIELDS, {**required, "name": "Leaner"}))
    assert resp.status_code == 303, resp.text[:2000]
    got = api.get("/v1/admin/buyers/lean").json()
    assert (got["name"], got["active"]) == ("Leaner", False)


def test_a_publisher_form_with_its_optional_fields_left_empty_creates_and_saves(api, browser):
    from webhooks.web.ops import publishers

    resp = post(api, browser, "/ops/publishers", as_a_browser_sends(publishers.NEW_FIELDS, {"id": "lp", "name": "LP"}))
    assert resp.status_code == 201, resp.text[:2000]
    key = api.get("/v1/admin/publishers/lp").json()["api_key_hint"]
    resp = post(api, browser, "/ops/publishers/lp", as_a_browser_sends(publishers.FIELDS, {"name": "LP2"}))
    assert resp.status_code == 303, resp.text[:2000]
    got = api.get("/v1/admin/publishers/lp").json()
    assert (got["name"], got["api_key_hint"]) == ("LP2", key)


def test_the_lead_search_form_with_fields_left_empty_filters_by_the_filled_ones(api, browser):
    from tests.web.test_lists import BASE, lead, settle

    api.put_publisher("north")
    settle([lead("north", "l-1", BASE, "bravo"), lead("north", "l-2", BASE, "charlie"), lead("north", "l-3", BASE)])
    empty = {"publisher_id": "", "buyer_id": "bravo", "status": "", "since": "", "until": ""}
    resp = browser[0].get(api.base + "/ops/leads", params=empty)
    assert resp.status_code == 200, resp.text[:2000]
    assert re.findall(r'data-lead="([^"]+)"', resp.text) == ["l-1"]
    assert 'name="buyer_id" value="bravo"' in resp.text and 'role="alert"' not in resp.text
    everything = browser[0].get(api.base + "/ops/leads", params={**empty, "buyer_id": ""})
    assert sorted(re.findall(r'data-lead="([^"]+)"', everything.text)) == ["l-1", "l-2", "l-3"]


def test_a_statement_month_the_buyer_page_cannot_show_is_a_refusal_on_the_page(api, browser, buyer_server):
    billing = {"mode": "prepaid", "account": "acct-m", "currency": "USD"}
    api.put_buyer("billed", buyer_server.url("billed"), billing=billing)
    resp = browser[0].get(api.base + "/ops/buyers/billed", params={"month": "2026-13"})
    assert resp.status_code == 400 and resp.headers["Content-Type"].startswith("text/html"), resp.text[:300]
    assert 'data-error-for="month"' in resp.text and 'name="month" value="2026-13"' in resp.text
    assert 'id="statement"' in resp.text  # this month's statement, below the refusal
    assert browser[0].get(api.base + "/ops/buyers/billed", params={"month": ""}).status_code == 200
