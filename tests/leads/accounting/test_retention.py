"""What a lead leaves behind is bounded (docs/api.md "Data kept per lead is bounded"): bodies of
unsold and test leads are emptied after LEAD_BODY_RETENTION_DAYS, of sold ones after
SOLD_LEAD_BODY_RETENTION_DAYS, the figures staying; DELETE .../personal-data erases one
lead's body at once. Real Redis and database; the purge runs as `flask leads purge`."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from webhooks import services
from webhooks.caps.dedupe import stored_consumer_keys
from webhooks.leads.accounting import ledger
from webhooks.leads.accounting.item import SettlementItem
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.live import keys
from webhooks.storage.live.scripts import Lease
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, Lead, LeadAttempt, Publisher
from webhooks.storage.states import LeadStatus

PUB = PublisherRule(id="surge", active=True, payout_pct=Decimal("10"))
NOW = datetime.now(timezone.utc)
BODY = '{"lead_id": "%s", "email": "ada@example.com", "phone": "+15125550100"}'


def _item(lead_id: str, age_days: float, status: str) -> SettlementItem:
    at = NOW - timedelta(days=age_days)
    if status in (LeadStatus.SOLD, LeadStatus.RETURNED, LeadStatus.TEST_SOLD):
        out = Outcome(
            LeadStatus.SOLD,
            "acme",
            Decimal("12.50"),
            at,
            Lease(buyer_id="acme", lease_id="l-" + lead_id, counters=(), reserved_us=1),
            [
                {"buyer_id": "zen", "outcome": "timeout", "ms": 1500},
                {"buyer_id": "acme", "outcome": "accepted", "ms": 41},
            ],
        )
    else:
        out = Outcome(attempts=[{"buyer_id": "zen", "outcome": "rejected", "ms": 12}])
    test = status.startswith("test_")
    item = settlement.make_item(
        publisher=PUB, lead_id=lead_id, outcome=out, payload=BODY % lead_id, received_at=at, request_id=None, test=test
    )
    if status == LeadStatus.RETURNED:
        return replace(item, status=LeadStatus.RETURNED)
    return item


LEADS = {  # lead_id: (age in days, status, whether its body is kept under the defaults 30 / 365)
    "unsold-new": (29, LeadStatus.UNSOLD, True),
    "unsold-old": (31, LeadStatus.UNSOLD, False),
    "test-sold-old": (31, LeadStatus.TEST_SOLD, False),
    "test-unsold-old": (45, LeadStatus.TEST_UNSOLD, False),
    "sold-month": (31, LeadStatus.SOLD, True),
    "sold-old": (366, LeadStatus.SOLD, False),
    "returned-old": (400, LeadStatus.RETURNED, False),
    "returned-new": (200, LeadStatus.RETURNED, True),
}


@pytest.fixture
def aged(api):
    """The leads of LEADS in the ledger, received that many days ago."""
    with db.connection_context():
        Publisher.create(id="surge", name="Surge", api_key_hash="h" * 64, api_key_hint="abcd", commission_pct=10)
        assert ledger.settle([_item(lead_id, age, status) for lead_id, (age, status, _) in LEADS.items()]) == len(LEADS)
    return api


def _ledger() -> dict[str, tuple]:
    with db.connection_context():
        rows = Lead.select().where(Lead.publisher_id == "surge")
        attempts = {a.lead_id: 0 for a in LeadAttempt.select()}
        for a in LeadAttempt.select():
            attempts[a.lead_id] += 1
        return {
            r.lead_id: (r.payload, r.status, r.buyer_id, r.price, r.payout, r.received_at, attempts.get(r.lead_id))
            for r in rows
        }


def _purge(app, *args: str) -> str:
    result = app.test_cli_runner().invoke(args=["leads", "purge", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_bodies_past_retention_are_emptied_by_status_and_age_and_the_figures_stay(aged, app):
    before = _ledger()
    out = _purge(app)
    after = _ledger()
    for lead_id, (_age, _status, kept) in LEADS.items():
        assert after[lead_id][0] == (before[lead_id][0] if kept else ""), lead_id
        assert after[lead_id][1:] == before[lead_id][1:], lead_id  # status, sale, price, payout, attempts
    assert "3 unsold lead bodies emptied, 2 sold lead bodies emptied" in out
    # run again (the hourly job beside the command): nothing more to do, nothing changes
    assert "0 unsold lead bodies emptied, 0 sold lead bodies emptied" in _purge(app)
    assert _ledger() == after


def test_the_purge_walks_in_chunks_and_carries_on_from_its_mark(aged, app):
    redis = services.of(app).queue_redis.redis
    groups = ledger.kept(30, 365)
    with db.connection_context():
        # a budget of nothing: one chunk of one lead per group, then the run ends
        first = ledger.purge_bodies(redis, groups, NOW, chunk=1, time_budget_s=0.0)
        assert first == {"unsold": 0, "sold": 0}
        ledger.purge_bodies(redis, groups, NOW, chunk=1, time_budget_s=-1)
        marks = {g.name: ledger.Mark.loads(redis.get(keys.retention_mark(g.name))) for g in groups}
        done = ledger.purge_bodies(redis, groups, NOW, chunk=1, time_budget_s=30.0)
    assert done == {"unsold": 3, "sold": 2}
    assert all(mark is None for mark in marks.values())  # the budget ran out before any chunk
    with db.connection_context():
        # a lead that ages past retention later is found by a later run, from the mark on
        old = _item("unsold-later", 0, LeadStatus.UNSOLD)
        ledger.settle([old])
        assert ledger.purge_bodies(redis, groups, NOW + timedelta(days=31), chunk=2) == {"unsold": 2, "sold": 0}
    assert _ledger()["unsold-later"][0] == "" and _ledger()["unsold-new"][0] == ""


def test_erasing_a_leads_personal_data_empties_its_body_keeps_its_sale_and_is_audited(aged, api):
    before = _ledger()["sold-month"]
    resp = api.http.delete(
        f"{api.base}/v1/admin/leads/sold-month/personal-data", params={"publisher_id": "surge"}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["lead_id"], body["status"], body["buyer_id"], body["price"], body["commission"]) == (
        "sold-month",
        "sold",
        "acme",
        "12.50",
        "1.25",
    )
    assert body["personal_data"] == "erased"
    after = _ledger()["sold-month"]
    assert after[0] == "" and after[1:] == before[1:]
    assert "ada@example.com" not in json.dumps(api.get("/v1/admin/leads/sold-month").json())
    with db.connection_context():
        audit = list(AuditLog.select().where(AuditLog.action == "lead.personal_data_erased"))
    assert [(a.entity, a.entity_id) for a in audit] == [("lead", "surge:sold-month")]
    # again: 200, nothing left to erase
    again = api.http.delete(f"{api.base}/v1/admin/leads/sold-month/personal-data", headers=api.admin)
    assert again.status_code == 200
    assert _ledger()["sold-month"] == after


def test_erasing_an_unknown_or_ambiguous_lead_is_404_or_409_as_get(aged, api):
    with db.connection_context():
        Publisher.create(id="other", name="Other", api_key_hash="i" * 64, api_key_hint="abcd", commission_pct=10)
        ledger.settle([replace(_item("unsold-new", 1, LeadStatus.UNSOLD), publisher_id="other")])
    url = f"{api.base}/v1/admin/leads/%s/personal-data"
    assert api.http.delete(url % "nope", headers=api.admin).status_code == 404
    ambiguous = api.http.delete(url % "unsold-new", headers=api.admin)
    assert (ambiguous.status_code, ambiguous.json()["error"]["code"]) == (409, "ambiguous_lead_id")
    assert _ledger()["unsold-new"][0] != ""
    ok = api.http.delete(url % "unsold-new", params={"publisher_id": "other"}, headers=api.admin)
    assert ok.status_code == 200
    assert _ledger()["unsold-new"][0] != ""  # surge's lead of that id is not touched


def test_erasing_a_sold_lead_forgets_its_consumer_at_the_buyer(api, app, buyer_server, worker):
    buyer_server.add("dd")
    key = api.put_publisher("surge", commission_pct="10")
    api.put_buyer("dd", buyer_server.url("dd"), dedupe={"fields": ["email", "phone"], "days": 30})
    api.settle_config()
    lead = {"email": "Ada@Example.com", "phone": "+15125550100", "state": "TX"}
    assert api.post_lead(key, {"lead_id": "E1", **lead}).json()["status"] == "sold"
    api.wait_settled("E1", "surge")
    digests = stored_consumer_keys("dd", ("email", "phone"), lead)
    r = services.of(app).store.redis
    assert r.exists(*digests) == 2
    assert api.post_lead(key, {"lead_id": "E2", **lead}).json()["status"] == "unsold"  # a duplicate
    resp = api.http.delete(f"{api.base}/v1/admin/leads/E1/personal-data", headers=api.admin)
    assert resp.status_code == 200
    assert r.exists(*digests) == 0
    assert api.post_lead(key, {"lead_id": "E3", **lead}).json()["status"] == "sold"  # forgotten


def test_the_purge_is_an_hourly_job_that_a_redis_outage_ends_quietly(aged, app, monkeypatch):
    from testkit.servers import free_port
    from webhooks.storage.live.redis import make_store
    from workers import retention
    from workers.context import Backends
    from workers.schedule import PERIODIC

    assert "workers.retention.purge_bodies" in {d["func"] for d in PERIODIC}
    cfg = services.of(app).config
    down = make_store(f"redis://127.0.0.1:{free_port()}/0", 2)
    monkeypatch.setattr(retention, "backends", lambda: Backends(cfg, down, down))
    assert retention.purge_bodies() == {}  # no exception for RQ (whose failure handling needs Redis)
    assert _ledger()["unsold-old"][0] != ""  # left for the next run
    up = services.of(app).queue_redis
    monkeypatch.setattr(retention, "backends", lambda: Backends(cfg, up, up))
    assert retention.purge_bodies() == {"unsold": 3, "sold": 2}
