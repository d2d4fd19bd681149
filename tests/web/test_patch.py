"""PATCH /v1/admin/publishers/<id> and /v1/admin/buyers/<id>: a JSON merge patch (RFC 7396) of
the stored object as GET shows it (docs/api.md "Lists, partial updates and the operator
console"): fields not named are kept, a publisher's API key and a buyer's credentials among
them; nothing is written when the result does not validate."""

from __future__ import annotations

import json

import pytest

from webhooks.storage.records.db import db
from webhooks.storage.records.models import Buyer

KEY = "pk_test_patch_0123456789"


def _patch(api, path: str, body) -> object:
    return api.http.patch(
        api.base + path,
        data=json.dumps(body),
        headers={**api.admin, "Content-Type": "application/merge-patch+json"},
    )


def test_a_publisher_patched_keeps_its_key_and_every_field_not_named(api, buyer_server):
    buyer_server.add("acme")
    api.put_publisher("surge", api_key=KEY, commission_pct="10", rate_limit={"per_second": 5, "burst": 10})
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    resp = _patch(api, "/v1/admin/publishers/surge", {"name": "Surge Media"})
    assert resp.status_code == 200, resp.text
    shown = resp.json()
    assert (shown["name"], shown["commission_pct"], shown["rate_limit"]) == (
        "Surge Media",
        "10.00",
        {"per_second": 5, "burst": 10},
    )
    api.settle_config()
    assert api.post_lead(KEY, {"lead_id": "p-1", "state": "TX"}).json()["status"] == "sold"  # the key kept
    assert _patch(api, "/v1/admin/publishers/surge", {"commission_pct": "15"}).json()["payout"] == {
        "type": "percent",
        "pct": "15.00",
    }
    fixed = _patch(api, "/v1/admin/publishers/surge", {"payout": {"type": "fixed", "amount": "3.00"}}).json()
    assert fixed["payout"] == {"type": "fixed", "amount": "3.00"}
    assert _patch(api, "/v1/admin/publishers/surge", {"rate_limit": None}).json()["rate_limit"] is None
    new_key = "pk_test_patch_new_0123456789"
    assert _patch(api, "/v1/admin/publishers/surge", {"api_key": new_key}).status_code == 200
    api.settle_config()
    assert api.post_lead(new_key, {"lead_id": "p-2", "state": "TX"}).status_code == 200
    assert api.post_lead(KEY, {"lead_id": "p-3", "state": "TX"}).status_code == 401


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/admin/publishers/nobody", {"name": "x"}, 404),
        ("/v1/admin/buyers/nobody", {"name": "x"}, 404),
        ("/v1/admin/publishers/surge", ["name"], 400),
        ("/v1/admin/publishers/surge", {"name": None}, 400),  # required: removing it is refused
        ("/v1/admin/publishers/surge", {"commission_pct": "101"}, 400),
        ("/v1/admin/buyers/acme", {"price": "-1"}, 400),
        ("/v1/admin/buyers/acme", {"caps": {"hourly": "many"}}, 400),
        ("/v1/admin/buyers/acme", "null", 400),
    ],
)
def test_a_patch_that_does_not_validate_changes_nothing(api, buyer_server, path, body, status):
    api.put_publisher("surge", api_key=KEY)
    api.put_buyer("acme", buyer_server.url("acme"), caps={"hourly": 5})
    before = (api.get("/v1/admin/publishers/surge").json(), api.get("/v1/admin/buyers/acme").json())
    resp = _patch(api, path, body)
    assert resp.status_code == status, resp.text
    assert "error" in resp.json()
    after = (api.get("/v1/admin/publishers/surge").json(), api.get("/v1/admin/buyers/acme").json())
    assert after == before


def test_a_buyer_patched_keeps_its_secrets_and_merges_its_caps(api, buyer_server):
    secret = "sk_live_abcdefghijklmnop1234"
    api.put_buyer(
        "acme",
        buyer_server.url("acme") + "?token=t0ps3cretvalue",
        caps={"hourly": 5, "daily": 50},
        delivery={"headers": {"X-Api-Key": secret}},
    )
    resp = _patch(api, "/v1/admin/buyers/acme", {"active": False, "caps": {"daily": 80, "hourly": None}})
    assert resp.status_code == 200, resp.text
    assert (resp.json()["active"], resp.json()["caps"]) == (False, {"daily": 80})
    with db.connection_context():
        row = Buyer.get_by_id("acme")
    assert json.loads(row.delivery)["headers"] == {"X-Api-Key": secret}  # not the redacted form
    assert row.endpoint_url.endswith("?token=t0ps3cretvalue")
    assert _patch(api, "/v1/admin/buyers/acme", {"active": True}).json()["active"] is True


def test_a_patch_that_bills_a_buyer_sets_its_balance(api, buyer_server):
    api.put_buyer("acme", buyer_server.url("acme"))
    billing = {"mode": "credit", "account": "buyer-acme", "currency": "USD", "credit_limit": "100.00"}
    resp = _patch(api, "/v1/admin/buyers/acme", {"billing": billing})
    assert resp.status_code == 200, resp.text
    shown = api.get("/v1/admin/buyers/acme").json()
    assert shown["billing"] == billing
    assert shown["balance"] == {"currency": "USD", "available": "100.00", "wallet": "0.00", "reserved": "0.00"}
    assert _patch(api, "/v1/admin/buyers/acme", {"billing": None}).json()["billing"] is None


def test_a_deleted_buyer_cannot_be_patched_back(api, buyer_server):
    api.put_buyer("acme", buyer_server.url("acme"))
    assert api.http.delete(api.base + "/v1/admin/buyers/acme", headers=api.admin).status_code == 204
    assert _patch(api, "/v1/admin/buyers/acme", {"active": True}).status_code == 404
