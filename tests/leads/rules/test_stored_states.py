"""Publishers and buyers stored before state values had to be US state codes: they load and
route leads as before, stay editable and can be paused (one by one or from the list); only
a write that sets new state values is checked."""

from __future__ import annotations

import json

from tests.web.ops.conftest import browser, post  # noqa: F401 (browser is a fixture)
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, Buyer, Publisher

LEGACY_SPEC = {"state": {"type": "enum", "values": ["ON", "California"]}}


def store_legacy(api, buyer_server) -> str:
    """A publisher whose spec's `state` enum and a buyer whose `states` hold values that are no
    US state codes, written to the database as an earlier release stored them."""
    key = api.put_publisher("surge")
    api.put_buyer("legacy", buyer_server.url("legacy"))
    with db.connection_context():
        Publisher.update(fields_spec=json.dumps(LEGACY_SPEC)).where(Publisher.id == "surge").execute()
        Buyer.update(states=json.dumps(["ON"])).where(Buyer.id == "legacy").execute()
    api.settle_config()
    return key


def test_stored_legacy_states_load_and_route_leads(api, buyer_server):
    stub = buyer_server.add("legacy")
    key = store_legacy(api, buyer_server)
    resp = api.post_lead(key, {"lead_id": "l1", "state": "ON"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["attempts"][0]["outcome"] == "accepted", resp.text
    assert len(stub.arrived) == 1
    assert api.get("/v1/admin/publishers/surge").json()["fields"] == LEGACY_SPEC
    assert api.get("/v1/admin/buyers/legacy").json()["states"] == ["ON"]


def test_the_api_refuses_new_legacy_states_but_keeps_stored_ones(api, buyer_server):
    store_legacy(api, buyer_server)
    patch = {**api.admin, "Content-Type": "application/merge-patch+json"}
    for path, body, field in (
        ("publishers/surge", {"fields": {"state": {"type": "enum", "values": ["ON", "QC"]}}}, "fields.state.values"),
        ("buyers/legacy", {"states": ["ON", "QC"]}, "states"),
    ):
        resp = api.http.patch(f"{api.base}/v1/admin/{path}", headers=patch, data=json.dumps(body))
        assert resp.status_code == 400 and resp.json()["error"]["message"].startswith(field), resp.text
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/fresh",
        headers=api.admin,
        json={"name": "F", "endpoint_url": "http://x.example/", "price": "1.00", "states": ["ON"]},
    )
    assert resp.status_code == 400, resp.text
    resp = api.http.put(
        f"{api.base}/v1/admin/publishers/fresh",
        headers=api.admin,
        json={"name": "F", "api_key": "pk_test_fresh_0123456789", "fields": LEGACY_SPEC},
    )
    assert resp.status_code == 400, resp.text
    for path, body in (("publishers/surge", {"name": "Surge 2"}), ("buyers/legacy", {"name": "Legacy 2"})):
        resp = api.http.patch(f"{api.base}/v1/admin/{path}", headers=patch, data=json.dumps(body))
        assert resp.status_code == 200, resp.text
    assert api.get("/v1/admin/buyers/legacy").json()["states"] == ["ON"]
    assert api.get("/v1/admin/publishers/surge").json()["fields"] == LEGACY_SPEC


def active(buyer_id: str) -> bool:
    with db.connection_context():
        return bool(Buyer.get_by_id(buyer_id).active)


def updates(buyer_id: str) -> int:
    with db.connection_context():
        return AuditLog.select().where(AuditLog.entity_id == buyer_id, AuditLog.action == "buyer.update").count()


def test_a_legacy_buyer_is_paused_alone_and_from_the_list(api, browser, buyer_server):  # noqa: F811
    store_legacy(api, buyer_server)
    api.put_buyer("other", buyer_server.url("other"))
    assert post(api, browser, "/ops/buyers/legacy/pause", {}).status_code == 303
    assert not active("legacy")
    assert post(api, browser, "/ops/buyers/legacy/resume", {}).status_code == 303
    before = updates("legacy"), updates("other")
    resp = post(
        api, browser, "/ops/selected-buyers", [("action", "pause"), ("buyer_id", "legacy"), ("buyer_id", "other")]
    )
    assert resp.status_code == 200, resp.text
    assert (active("legacy"), active("other")) == (False, False)
    assert (updates("legacy"), updates("other")) == (before[0] + 1, before[1] + 1)
    with db.connection_context():
        assert json.loads(Buyer.get_by_id("legacy").states) == ["ON"]


def test_a_buyer_deleted_before_the_pause_stays_deleted(api, buyer_server):
    from webhooks import services
    from webhooks.leads.rules import buyer_service

    api.put_buyer("a", buyer_server.url("a"))
    api.put_buyer("gone", buyer_server.url("gone"))
    with db.connection_context():
        rows = list(Buyer.select().where(Buyer.id.in_(["a", "gone"])).order_by(Buyer.id))
    assert api.http.delete(f"{api.base}/v1/admin/buyers/gone", headers=api.admin).status_code in (200, 204)
    with api.app.app_context(), db.connection_context():
        changed = buyer_service.set_active(services.current().store, rows, active=False)
    assert [row.id for row in changed] == ["a"]
    with db.connection_context():
        gone = Buyer.get_by_id("gone")
        assert gone.deleted_at is not None
        assert not Buyer.get_by_id("a").active
    assert updates("gone") == 0
