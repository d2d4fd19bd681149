"""Admin API: auth, validation with the JSON error shape, nothing partial stored, propagation."""

from __future__ import annotations

import pytest

from tests.conftest import ADMIN_TOKEN
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, Buyer, Publisher

GOOD_BUYER = {
    "name": "Acme Insurance",
    "endpoint_url": "http://127.0.0.1:9100/acme",
    "priority": 1,
    "price": "12.50",
    "timezone": "America/Chicago",
    "caps": {"hourly": 10, "daily": 100, "weekly": 400, "monthly": 1500, "daily_budget": "900.00"},
    "states": ["TX", "ok"],
    "blocked_publishers": ["pub-7"],
    "schedule": {"mon": [["09:00", "17:00"]], "tue": [["09:00", "12:00"], ["13:00", "24:00"]]},
    "active": True,
}


def test_admin_requires_the_token(api):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_TOKEN}):
        resp = api.http.get(f"{api.base}/v1/admin/buyers/acme", headers=headers)
        assert resp.status_code == 401
        assert resp.json() == {"error": {"code": "unauthorized", "message": "missing or wrong admin token"}}


def test_buyer_put_then_get_round_trips_with_zero_usage(api):
    resp = api.http.put(f"{api.base}/v1/admin/buyers/acme", json=GOOD_BUYER, headers=api.admin)
    assert resp.status_code == 200, resp.text
    body = api.get("/v1/admin/buyers/acme").json()
    for field in (
        "name",
        "endpoint_url",
        "priority",
        "price",
        "timezone",
        "caps",
        "blocked_publishers",
        "schedule",
        "active",
    ):
        assert body[field] == GOOD_BUYER[field], field
    assert body["states"] == ["OK", "TX"]
    assert body["usage"]["hourly"]["used"] == 0 and body["usage"]["hourly"]["limit"] == 10
    assert body["usage"]["daily_budget"]["used"] == "0.00"
    assert body["usage"]["daily_budget"]["limit"] == "900.00"
    assert set(body["usage"]) == {"hourly", "daily", "weekly", "monthly", "daily_budget"}


def test_buyer_put_replaces_and_get_round_trip_can_be_put_back(api):
    api.http.put(f"{api.base}/v1/admin/buyers/acme", json=GOOD_BUYER, headers=api.admin)
    fetched = api.get("/v1/admin/buyers/acme").json()
    fetched["price"] = "13.00"
    fetched["caps"] = {"daily": 5}
    resp = api.http.put(f"{api.base}/v1/admin/buyers/acme", json=fetched, headers=api.admin)
    assert resp.status_code == 200, resp.text
    again = api.get("/v1/admin/buyers/acme").json()
    assert again["price"] == "13.00" and again["caps"] == {"daily": 5}
    assert set(again["usage"]) == {"daily"}


BAD_BUYERS = [
    ("timezone", {"timezone": "Mars/Olympus_Mons"}),
    ("timezone", {"timezone": "../../etc/passwd"}),
    ("schedule.mon[0]", {"schedule": {"mon": [["17:00", "09:00"]]}}),
    ("schedule.mon[0]", {"schedule": {"mon": [["9am", "17:00"]]}}),
    ("schedule.mon[0]", {"schedule": {"mon": [["09:00", "24:30"]]}}),
    ("schedule.funday", {"schedule": {"funday": [["09:00", "17:00"]]}}),
    ("schedule.mon", {"schedule": {"mon": "09:00-17:00"}}),
    ("caps.hourly", {"caps": {"hourly": -1}}),
    ("caps.daily", {"caps": {"daily": 2.5}}),
    ("caps.daily", {"caps": {"daily": "10"}}),
    ("caps.weekly", {"caps": {"weekly": True}}),
    ("caps.daily_budget", {"caps": {"daily_budget": "abc"}}),
    ("caps.yearly", {"caps": {"yearly": 5}}),
    ("endpoint_url", {"endpoint_url": "ftp://example.com/x"}),
    ("endpoint_url", {"endpoint_url": "not a url"}),
    ("endpoint_url", {"endpoint_url": "http://host:99999/x"}),
    ("price", {"price": "12.505"}),
    ("price", {"price": "-1"}),
    ("price", {"price": "NaN"}),
    ("price", {"price": "twelve"}),
    ("priority", {"priority": "1"}),
    ("states", {"states": "TX"}),
    ("states", {"states": ["TX", "ZZ", "texas"]}),
    ("blocked_publishers", {"blocked_publishers": ["ok", "bad id!"]}),
    ("active", {"active": "yes"}),
    ("name", {"name": ""}),
    ("colour", {"colour": "blue"}),
]


@pytest.mark.parametrize("field,change", BAD_BUYERS, ids=[f"{f}:{list(c.values())[0]}" for f, c in BAD_BUYERS])
def test_bad_buyer_is_refused_naming_the_field_and_nothing_is_stored(api, field, change):
    resp = api.http.put(f"{api.base}/v1/admin/buyers/acme", json={**GOOD_BUYER, **change}, headers=api.admin)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "invalid_buyer"
    assert err["message"].startswith(field + ":"), err
    with db.connection_context():
        assert Buyer.select().count() == 0
        assert AuditLog.select().count() == 0


def test_a_state_that_is_no_us_state_code_is_refused_by_name(api):
    bad = {**GOOD_BUYER, "states": ["TX", "ZZ", "texas"]}
    resp = api.http.put(f"{api.base}/v1/admin/buyers/acme", json=bad, headers=api.admin)
    assert resp.status_code == 400
    assert resp.json() == {
        "error": {
            "code": "invalid_buyer",
            "message": "states: 'ZZ', 'texas': not a US state or territory code (two letters, e.g. TX for Texas)",
        }
    }
    ok = {**GOOD_BUYER, "states": [" pr", "DC", "tx", "TX"]}  # territories and DC too, any case, once each
    assert api.http.put(f"{api.base}/v1/admin/buyers/acme", json=ok, headers=api.admin).status_code == 200
    assert api.get("/v1/admin/buyers/acme").json()["states"] == ["DC", "PR", "TX"]


def test_a_buyer_with_many_bad_fields_is_answered_with_the_first_in_the_error_shape(api):
    bad = {**GOOD_BUYER, "price": "twelve", "states": ["ZZ"], "weight": 0, "caps": {"daily": -1}}
    resp = api.http.put(f"{api.base}/v1/admin/buyers/acme", json=bad, headers=api.admin)
    assert resp.status_code == 400
    assert list(resp.json()) == ["error"] and set(resp.json()["error"]) == {"code", "message"}
    assert resp.json()["error"]["message"].startswith("caps.daily:")  # checked first, as before


def test_bad_buyer_update_leaves_the_stored_buyer_unchanged(api):
    api.http.put(f"{api.base}/v1/admin/buyers/acme", json=GOOD_BUYER, headers=api.admin)
    bad = {**GOOD_BUYER, "price": "1.00", "caps": {"hourly": -5}}
    assert api.http.put(f"{api.base}/v1/admin/buyers/acme", json=bad, headers=api.admin).status_code == 400
    assert api.get("/v1/admin/buyers/acme").json()["price"] == "12.50"


@pytest.mark.parametrize(
    "raw,code",
    [
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_buyer"),
        (b"", "invalid_json"),
    ],
)
def test_malformed_body_gets_json_error(api, raw, code):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/acme", data=raw, headers={**api.admin, "Content-Type": "application/json"}
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == code


def test_oversized_body_is_refused_with_413(api):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/acme",
        data=b"x" * (256 * 1024 + 1),
        headers={**api.admin, "Content-Type": "application/json"},
    )
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "too_large"


def test_bad_path_id_is_a_json_404(api):
    resp = api.get("/v1/admin/buyers/" + "x" * 65)
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "not_found"
    assert api.get("/v1/admin/buyers/bad$id").status_code == 404


def test_delete_buyer_hides_it_and_keeps_history(api):
    api.http.put(f"{api.base}/v1/admin/buyers/acme", json=GOOD_BUYER, headers=api.admin)
    assert api.http.delete(f"{api.base}/v1/admin/buyers/acme", headers=api.admin).status_code == 204
    assert api.get("/v1/admin/buyers/acme").status_code == 404
    assert api.http.delete(f"{api.base}/v1/admin/buyers/acme", headers=api.admin).status_code == 404
    with db.connection_context():
        assert Buyer.get_by_id("acme").deleted_at is not None
    # PUT brings it back
    assert api.http.put(f"{api.base}/v1/admin/buyers/acme", json=GOOD_BUYER, headers=api.admin).status_code == 200
    assert api.get("/v1/admin/buyers/acme").status_code == 200


def test_publisher_put_validates_and_hides_the_key(api):
    url = f"{api.base}/v1/admin/publishers/surge"
    body = {"name": "Surge Media", "api_key": "pk_live_abcdefghijkl", "commission_pct": "10", "active": True}
    resp = api.http.put(url, json=body, headers=api.admin)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["name"] == "Surge Media" and out["commission_pct"] == "10.00" and out["active"] is True
    assert "pk_live_abcdefghijkl" not in resp.text
    for change, field in (
        ({"api_key": "short"}, "api_key"),
        ({"commission_pct": "101"}, "commission_pct"),
        ({"commission_pct": "x"}, "commission_pct"),
        ({"active": 1}, "active"),
    ):
        bad = api.http.put(url, json={**body, **change}, headers=api.admin)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_publisher"
        assert bad.json()["error"]["message"].startswith(field)
    other = api.http.put(f"{api.base}/v1/admin/publishers/other", json=body, headers=api.admin)
    assert other.status_code == 400 and "already used" in other.json()["error"]["message"]
    with db.connection_context():
        assert [p.id for p in Publisher.select()] == ["surge"]
