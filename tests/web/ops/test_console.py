"""The operator console (/ops): server-rendered pages whose forms go through the admin API's
own validation and functions; every form under the session with its CSRF token and the
same-origin check; every change in the audit log, shown on the page."""

from __future__ import annotations

import html
import re

from tests.web.ops.conftest import post

BUYER = {
    "id": "acme",
    "name": "Acme Leads",
    "endpoint_url": "https://buyer.example/leads?key=s3cret",
    "price": "12.50",
    "priority": "1",
    "timezone": "America/New_York",
}


def test_a_buyer_made_from_the_form_is_the_buyer_the_api_shows(api, browser):
    http, _ = browser
    resp = post(api, browser, "/ops/buyers", {**BUYER, "caps.daily": "40", "states": "CA, ny"})
    assert resp.status_code == 303 and resp.headers["Location"].startswith("/ops/buyers/acme?notice=created")
    got = api.get("/v1/admin/buyers/acme").json()
    assert got["name"] == "Acme Leads" and got["price"] == "12.50" and got["priority"] == 1
    assert got["timezone"] == "America/New_York" and got["caps"] == {"daily": 40} and got["states"] == ["CA", "NY"]
    assert got["active"] is True  # a form without the box keeps the default
    page = http.get(api.base + resp.headers["Location"]).text
    assert "Created." in page and 'data-active="true"' in page and "s3cret" not in page
    assert 'data-action="buyer.create"' in page  # its audit row, on its page


def test_a_refused_form_shows_each_error_beside_its_field_and_saves_nothing(api, browser):
    resp = post(api, browser, "/ops/buyers", {**BUYER, "price": "twelve", "caps.daily": "3"})
    assert resp.status_code == 400
    errors = dict(re.findall(r'data-error-for="([^"]+)">([^<]+)<', resp.text))
    assert list(errors) == ["price"] and "twelve" in resp.text  # what was typed is kept
    assert api.get("/v1/admin/buyers/acme").status_code == 404
    resp = post(api, browser, "/ops/buyers", {**BUYER, "caps.daily": "-3"})
    assert resp.status_code == 400 and re.search(r'data-error-for="caps.daily">', resp.text)
    resp = post(api, browser, "/ops/buyers", {**BUYER, "delivery.fields": "{not json"})
    assert resp.status_code == 400 and re.search(r'data-error-for="delivery.fields">is not JSON', resp.text)
    resp = post(api, browser, "/ops/buyers", {**BUYER, "id": "no spaces"})
    assert resp.status_code == 400 and re.search(r'data-error-for="id">', resp.text)
    assert api.get("/v1/admin/buyers").json()["items"] == []


def test_the_create_form_never_replaces_a_buyer(api, browser):
    assert post(api, browser, "/ops/buyers", BUYER).status_code == 303
    resp = post(api, browser, "/ops/buyers", {**BUYER, "name": "Impostor"})
    assert resp.status_code == 400 and re.search(r'data-error-for="id">is taken', resp.text)
    assert api.get("/v1/admin/buyers/acme").json()["name"] == "Acme Leads"


def test_edit_pause_and_resume_a_buyer(api, browser):
    http, _ = browser
    post(api, browser, "/ops/buyers", {**BUYER, "caps.daily": "40", "caps.hourly": "5"})
    page = http.get(api.base + "/ops/buyers/acme").text
    assert 'name="endpoint_url" value="https://buyer.example/leads?key=' in page and "s3cret" not in page
    # the edit form sent back as shown, with the hourly cap emptied and the price changed
    found = re.findall(r'<input type="text" id="[^"]+" name="([^"]+)" value="([^"]*)"', page)
    shown = {name: html.unescape(value) for name, value in found}  # as a browser sends them
    shown.update({"price": "13.00", "caps.hourly": "", "active": ""})
    fields = [*shown.items(), ("active", "on")]
    assert post(api, browser, "/ops/buyers/acme", fields).status_code == 303
    got = api.get("/v1/admin/buyers/acme").json()
    assert got["price"] == "13.00" and got["caps"] == {"daily": 40} and got["active"] is True
    assert api.get("/v1/admin/buyers/acme").status_code == 200
    # the stored URL's credentials survive the redacted form
    from webhooks.storage.records.models import Buyer

    assert Buyer.get_by_id("acme").endpoint_url == "https://buyer.example/leads?key=s3cret"
    resp = post(api, browser, "/ops/buyers/acme/pause", {})
    assert resp.status_code == 303 and api.get("/v1/admin/buyers/acme").json()["active"] is False
    assert 'data-active="false"' in http.get(api.base + resp.headers["Location"]).text
    assert post(api, browser, "/ops/buyers/acme/resume", {}).status_code == 303
    assert api.get("/v1/admin/buyers/acme").json()["active"] is True
    actions = re.findall(r'data-action="([^"]+)"', http.get(api.base + "/ops/buyers/acme").text)
    assert actions == ["buyer.update", "buyer.update", "buyer.update", "buyer.create"]


def test_every_page_renders(api, browser):
    http, _ = browser
    post(api, browser, "/ops/buyers", BUYER)
    api.put_publisher("pub-1", api_key="pk_test_0123456789abcdef")
    for path in (
        "/ops",
        "/ops/buyers",
        "/ops/buyers/new",
        "/ops/buyers/acme",
        "/ops/publishers",
        "/ops/publishers/new",
        "/ops/publishers/pub-1",
        "/ops/leads",
        "/ops/leads?publisher_id=pub-1&status=sold",
        "/ops/payments",
        "/ops/events",
        "/ops/reports",
        "/ops/suppression",
        "/ops/audit",
    ):
        resp = http.get(api.base + path)
        assert resp.status_code == 200, (path, resp.text[:300])
        assert (
            resp.headers["Cache-Control"] == "no-store"
            and "script-src 'none'" in resp.headers["Content-Security-Policy"]
        )
        assert "<script" not in resp.text, path
