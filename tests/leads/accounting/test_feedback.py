"""Buyer feedback (docs/api.md "Feedback and earnings-per-lead routing", docs/buyers.md
"Feedback"), against the real Redis, database and app: stored once per the buyer's id, sent
again or many times at once; a lead not the buyer's answered as an unknown one; a sale's
conversion counted once in the leads report; the feedback shown on the lead's record and page."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from webhooks.caps import leases
from webhooks.leads.accounting import ledger
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Feedback, LeadStats

AT_ONCE = 10


def _settled(lead_id: str, buyer_id: str | None) -> None:
    """A lead of publisher `surge` settled as sold to `buyer_id` (None: unsold), as routing would."""
    at = datetime.now(timezone.utc)
    outcome = Outcome(status="unsold")
    if buyer_id is not None:
        lease = leases.Lease(buyer_id, "l", ())
        outcome = Outcome(status="sold", buyer_id=buyer_id, price=Decimal("20.00"), sold_at=at, lease=lease)
    item = settlement.make_item(
        publisher=PublisherRule(id="surge", active=True, payout_pct=Decimal("10")),
        lead_id=lead_id,
        outcome=outcome,
        payload="{}",
        received_at=at,
        request_id=None,
    )
    with db.connection_context():
        assert ledger.settle([item]) == 1


@pytest.fixture
def key_of(api, buyer_server) -> dict[str, str]:
    """Buyers alpha and bravo of publisher surge, each with its API key."""
    api.put_publisher("surge", commission_pct="10")
    out = {}
    for name in ("alpha", "bravo"):
        buyer_server.add(name)
        api.put_buyer(name, buyer_server.url(name), price="20.00")
        resp = api.http.post(f"{api.base}/v1/admin/buyers/{name}/api-key", headers=api.admin)
        assert resp.status_code == 201, resp.text
        out[name] = resp.json()["api_key"]
    return out


def _send(api, key: str, body, session=None):
    return (session or api.http).post(
        f"{api.base}/v1/buyer/feedback", json=body, headers={"Authorization": f"Bearer {key}"}
    )


def _body(feedback_id: str, lead_id: str = "a1", event: str = "converted", **more) -> dict:
    return {"id": feedback_id, "lead_id": lead_id, "publisher_id": "surge", "event": event, **more}


def _stored() -> list[tuple]:
    with db.connection_context():
        return [
            (f.buyer_id, f.feedback_id, f.lead_id, f.event, None if f.value is None else f"{f.value:.2f}")
            for f in Feedback.select().order_by(Feedback.id)
        ]


def _conversions() -> dict[str, int]:
    with db.connection_context():
        return {r.buyer_id: r.conversions for r in LeadStats.select() if r.conversions}


def _at_once(api, key: str, bodies: list[dict]) -> list:
    """Each body sent on its own session and thread, all released together."""
    start = threading.Barrier(len(bodies))

    def go(body: dict):
        session = api.session()
        start.wait()
        return _send(api, key, body, session)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(go, bodies))


def test_feedback_sent_twice_is_stored_once_and_answers_as_stored(api, key_of):
    _settled("a1", "alpha")
    first = _send(api, key_of["alpha"], _body("crm-1", value="120.5"))
    assert first.status_code == 200, first.text
    stored = first.json()
    assert {k: v for k, v in stored.items() if k != "created_at"} == {
        "id": "crm-1",
        "lead_id": "a1",
        "publisher_id": "surge",
        "event": "converted",
        "value": "120.50",
    }
    again = _send(api, key_of["alpha"], _body("crm-1", value="120.50"))  # the same value, written otherwise
    assert again.status_code == 200 and again.json() == stored
    assert _stored() == [("alpha", "crm-1", "a1", "converted", "120.50")]
    assert _conversions() == {"alpha": 1}


def test_feedback_sent_ten_times_at_once_is_stored_once(api, key_of):
    _settled("a1", "alpha")
    answers = _at_once(api, key_of["alpha"], [_body("crm-7", event="qualified", value="3")] * AT_ONCE)
    assert [r.status_code for r in answers] == [200] * AT_ONCE, [r.text for r in answers]
    assert len({r.content for r in answers}) == 1  # every one answered with the one stored
    assert _stored() == [("alpha", "crm-7", "a1", "qualified", "3.00")]


def test_ten_conversions_of_one_sale_at_once_count_one_conversion(api, key_of):
    """Ten feedback ids, each `converted`, at once: all stored, the sale converted once."""
    _settled("a1", "alpha")
    answers = _at_once(api, key_of["alpha"], [_body(f"conv-{n}") for n in range(AT_ONCE)])
    assert [r.status_code for r in answers] == [200] * AT_ONCE, [r.text for r in answers]
    assert sorted(s[1] for s in _stored()) == sorted(f"conv-{n}" for n in range(AT_ONCE))
    assert _conversions() == {"alpha": 1}


def test_another_body_under_a_used_id_is_409_and_changes_nothing(api, key_of):
    _settled("a1", "alpha")
    _settled("a2", "alpha")
    assert _send(api, key_of["alpha"], _body("crm-1", event="contacted")).status_code == 200
    for other in (
        _body("crm-1", event="bad"),
        _body("crm-1", event="contacted", value="1.00"),
        _body("crm-1", lead_id="a2", event="contacted"),
    ):
        resp = _send(api, key_of["alpha"], other)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "feedback_conflict", resp.text
    assert _stored() == [("alpha", "crm-1", "a1", "contacted", None)]
    # ids are the buyer's own: another buyer may use the same one
    _settled("b1", "bravo")
    assert _send(api, key_of["bravo"], _body("crm-1", lead_id="b1", event="bad")).status_code == 200
    assert _stored()[-1] == ("bravo", "crm-1", "b1", "bad", None)


def test_a_lead_not_sold_to_the_buyer_is_404_with_one_body_whoever_bought_it(api, key_of):
    _settled("a1", "alpha")
    _settled("b1", "bravo")
    _settled("u1", None)
    answers = [
        _send(api, key_of["alpha"], _body("x", lead_id=lead, publisher_id=publisher))
        for lead, publisher in (("b1", "surge"), ("nope", "surge"), ("u1", "surge"), ("a1", "other"))
    ]
    assert {r.status_code for r in answers} == {404}
    assert len({r.content for r in answers}) == 1, [r.text for r in answers]
    assert answers[0].json()["error"]["code"] == "not_found"
    assert _stored() == [] and _conversions() == {}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({"lead_id": "a1", "publisher_id": "surge", "event": "bad"}, "id"),
        (_body("x", lead_id="a 1"), "lead_id"),
        (_body("x", publisher_id=None), "publisher_id"),
        (_body("x", event="sold"), "event"),
        (_body("x", event=None), "event"),
        (_body("x", value=12), "value"),
        (_body("x", value="-1.00"), "value"),
        (_body("x", value="1.234"), "value"),
        (_body("x", value="1e3"), "value"),
        (_body("x", value="99999999999"), "value"),
        (_body("x", note="hi"), "note"),
    ],
)
def test_a_bad_field_is_400_naming_it_before_the_sale_is_looked_up(api, key_of, body, field):
    resp = _send(api, key_of["alpha"], body)  # no such lead: a 404 would mean the shape went unchecked
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_feedback", resp.text
    assert resp.json()["error"]["message"].startswith(f"{field}: ")


def test_an_empty_value_is_absent(api, key_of):
    _settled("a1", "alpha")
    for n, value in enumerate(("", None)):
        resp = _send(api, key_of["alpha"], _body(f"e{n}", event="contacted", value=value))
        assert resp.status_code == 200 and resp.json()["value"] is None, resp.text
    assert [s[4] for s in _stored()] == [None, None]


def test_a_conversion_counts_once_in_the_report_and_the_lead_shows_its_feedback(api, key_of):
    _settled("a1", "alpha")
    _settled("a2", "alpha")
    for body in (
        _body("f1", event="contacted"),
        _body("f2", event="converted", value="120.00"),
        _body("f2", event="converted", value="120.00"),  # again: nothing new
        _body("f3", event="converted"),  # the sale converted before: not counted again
        _body("f4", lead_id="a2", event="qualified"),
    ):
        assert _send(api, key_of["alpha"], body).status_code == 200
    today = datetime.now(timezone.utc).date().isoformat()
    report = api.get("/v1/admin/reports/leads", params={"from": today, "to": today, "group_by": "buyer"}).json()
    assert {r["key"]: r["conversions"] for r in report["rows"]} == {"alpha": 1}
    assert report["totals"]["conversions"] == 1

    record = api.get("/v1/admin/leads/a1", params={"publisher_id": "surge"}).json()
    (sale,) = record["sales"]
    assert [(f["id"], f["event"], f["value"]) for f in sale["feedback"]] == [
        ("f1", "contacted", None),
        ("f2", "converted", "120.00"),
        ("f3", "converted", None),
    ]  # oldest first
    assert all(set(f) == {"id", "event", "value", "created_at"} for f in sale["feedback"])
    page = api.get("/ops/leads/a1", params={"publisher_id": "surge"})
    assert page.status_code == 200
    assert page.text.count('data-feedback="') == 3 and 'data-event="converted"' in page.text
