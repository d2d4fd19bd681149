"""Event endpoints (docs/api.md "Event endpoints"): the admin API, filters by type and publisher,
order per endpoint and entity through a receiver that is down for a while, pausing and
automatic disabling without losing an event, replay with the same webhook-ids, and the events
log. Real receivers (local HTTP servers verifying with the standardwebhooks library), the real
database and Redis; the worker's engine runs in this process (deliver_inline), holding the
worker's lock so that no RQ worker of the session delivers at the same time.
tests/e2e/test_event_endpoints.py runs the real worker."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone

import pytest

from testkit.events import EventReceiver, deliver_inline, sale_item
from testkit.payments import deliver, encode, payload, refund_payload
from webhooks.events import endpoints
from webhooks.events import log as events_log
from webhooks.leads.accounting import ledger
from webhooks.storage.records.db import db
from webhooks.storage.records.models import EventDispatch, utcnow

SECRETS = {
    "a": "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
    "b": "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=",
    "c": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "d": "whsec_YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXo=",
}


@pytest.fixture
def receivers():
    made: dict[str, EventReceiver] = {}

    def make(name: str) -> EventReceiver:
        made[name] = EventReceiver(SECRETS[name])
        return made[name]

    yield make
    for r in made.values():
        r.close()


def put_endpoint(api, endpoint_id: str, url: str, **fields):
    resp = api.http.put(
        f"{api.base}/v1/admin/event-endpoints/{endpoint_id}", json={"url": url, **fields}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def credit(api, reference: str, amount: int, customer: str = "ada@example.com") -> None:
    resp = deliver(api, "standard", encode(payload("standard", reference, amount, "NGN", customer)))
    assert resp.json() == {"status": "credited"}, resp.text


def debit(api, reference: str, paid: str, amount: int, customer: str = "ada@example.com") -> None:
    resp = deliver(api, "standard", encode(refund_payload("standard", reference, paid, amount, "NGN", customer)))
    assert resp.json() == {"status": "debited"}, resp.text


def sell(publisher_id: str, lead_id: str, payout: str = "4.00") -> None:
    """A sale as the settlement writes it (its lead.sold event with it)."""
    with db.connection_context():
        assert ledger.settle([sale_item(publisher_id, lead_id, payout)]) == 1


def subjects(receiver: EventReceiver) -> list[str]:
    """What the receiver accepted, in order: wallet references and lead ids with their type."""
    out = []
    for a in receiver.accepted():
        data = a.body["data"]
        out.append(f"{a.body['type']}:{data.get('reference') or data['lead_id']}")
    return out


def test_an_endpoint_is_put_read_listed_and_deleted_and_its_secret_shown_once(api):
    made = put_endpoint(api, "app", "https://app.example/hooks", types=["lead.sold"])
    secret = made["secret"]
    assert secret.startswith("whsec_") and len(secret) > 30
    assert made | {"secret": None} == {
        "id": "app",
        "url": "https://app.example/hooks",
        "types": ["lead.sold"],
        "publisher_id": None,
        "secret": None,
        "enabled": True,
        "disabled_reason": None,
        "disabled_at": None,
        "last_error": None,
        "managed": False,
        "created_at": made["created_at"],
        "updated_at": made["updated_at"],
    }
    got = api.get("/v1/admin/event-endpoints/app").json()
    assert got["secret"] == "****" + secret[-4:]
    # the GET body put back keeps the secret; a changed url is taken
    again = put_endpoint(api, "app", "https://app.example/v2", **{k: v for k, v in got.items() if k != "url"})
    assert again["secret"] == "****" + secret[-4:] and again["url"] == "https://app.example/v2"
    with db.connection_context():
        assert endpoints.get("app").secret == secret
    # a given secret is taken, and shown in the answer that set it
    assert put_endpoint(api, "app", "https://app.example/v2", secret=SECRETS["a"])["secret"] == SECRETS["a"]
    assert put_endpoint(api, "postback", "https://pub.example/pb", publisher_id="surge")["types"] == [
        "lead.sold",
        "lead.returned",
    ]
    listed = api.get("/v1/admin/event-endpoints").json()["endpoints"]
    assert [e["id"] for e in listed] == ["app", "postback"] and all(e["secret"].startswith("****") for e in listed)
    assert api.http.delete(f"{api.base}/v1/admin/event-endpoints/app", headers=api.admin).status_code == 204
    assert api.get("/v1/admin/event-endpoints/app").status_code == 404
    assert api.http.delete(f"{api.base}/v1/admin/event-endpoints/app", headers=api.admin).status_code == 404


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "url"),
        ({"url": "ftp://app.example/"}, "url"),
        ({"url": "https://u:p@app.example/"}, "url"),
        ({"url": "https://app.example/\nHost: evil"}, "url"),
        ({"url": "https://app.example/", "types": []}, "types"),
        ({"url": "https://app.example/", "types": ["lead.bought"]}, "types"),
        ({"url": "https://app.example/", "types": "lead.sold"}, "types"),
        ({"url": "https://app.example/", "publisher_id": "surge", "types": ["wallet.credited"]}, "types"),
        ({"url": "https://app.example/", "publisher_id": "a b"}, "publisher_id"),
        ({"url": "https://app.example/", "secret": "hunter2"}, "secret"),
        ({"url": "https://app.example/", "secret": "whsec_c2hvcnQ="}, "secret"),
        ({"url": "https://app.example/", "enabled": "yes"}, "enabled"),
        ({"url": "https://app.example/", "filter": "x"}, "filter"),
    ],
)
def test_an_unusable_endpoint_is_refused_with_the_field_named(api, body, field):
    resp = api.http.put(f"{api.base}/v1/admin/event-endpoints/bad", json=body, headers=api.admin)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_endpoint" and field in resp.json()["error"]["message"]
    assert api.get("/v1/admin/event-endpoints/bad").status_code == 404


def test_the_managed_endpoint_is_changed_by_configuration_only_but_can_be_paused(api, receivers, engine_lock):
    app_side = receivers("a")
    with db.connection_context():
        endpoints.sync_managed(app_side.url, (SECRETS["a"],))
    url = f"{api.base}/v1/admin/event-endpoints/{endpoints.MANAGED_ID}"
    refused = api.http.put(url, json={"url": "https://elsewhere.example/"}, headers=api.admin)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "managed_endpoint"
    assert api.http.delete(url, headers=api.admin).status_code == 409
    shown = api.get(f"/v1/admin/event-endpoints/{endpoints.MANAGED_ID}").json()
    assert shown["managed"] and shown["url"] == app_side.url and shown["secret"] is None
    paused = api.http.put(url, json={**shown, "enabled": False}, headers=api.admin)
    assert paused.status_code == 200 and paused.json()["disabled_reason"] == "paused"


def test_each_endpoint_gets_the_types_and_the_publisher_it_asked_for(api, receivers, engine_lock):
    everything, wallets, surge, other = receivers("a"), receivers("b"), receivers("c"), receivers("d")
    put_endpoint(api, "everything", everything.url, secret=SECRETS["a"])
    put_endpoint(api, "wallets", wallets.url, secret=SECRETS["b"], types=["wallet.credited", "wallet.debited"])
    put_endpoint(api, "surge-postback", surge.url, secret=SECRETS["c"], publisher_id="surge")
    put_endpoint(api, "other-sales", other.url, secret=SECRETS["d"], publisher_id="other", types=["lead.sold"])
    api.put_publisher("surge")
    api.put_buyer("acme", "http://127.0.0.1:9/buy", priority=1)
    credit(api, "std-f1", 5_000)
    sell("surge", "s1")
    sell("other", "o1")
    debit(api, "rf-f1", "std-f1", 1_000)
    returned = api.http.post(f"{api.base}/v1/admin/leads/s1/return", json={"reason": "duplicate"}, headers=api.admin)
    assert returned.status_code == 200, returned.text
    sell("other", "o2")
    deliver_inline()
    got = subjects(everything)  # entities go in parallel; each one's events in order
    assert sorted(got) == sorted(
        [
            "wallet.credited:std-f1",
            "lead.sold:s1",
            "lead.sold:o1",
            "wallet.debited:rf-f1",
            "lead.returned:s1",
            "lead.sold:o2",
        ]
    )
    assert got.index("wallet.credited:std-f1") < got.index("wallet.debited:rf-f1")
    assert got.index("lead.sold:s1") < got.index("lead.returned:s1")
    assert subjects(wallets) == ["wallet.credited:std-f1", "wallet.debited:rf-f1"]
    assert subjects(surge) == ["lead.sold:s1", "lead.returned:s1"]
    assert sorted(subjects(other)) == ["lead.sold:o1", "lead.sold:o2"]
    sold_event = next(a.body for a in surge.accepted() if a.body["type"] == "lead.sold")
    assert sold_event["data"] == {  # per sale: its buyer and price (docs/api.md "Sales")
        "lead_id": "s1",
        "publisher_id": "surge",
        "payout": "4.00",
        "buyer_id": "acme",
        "price": "40.00",
    }
    returned_event = next(a.body for a in surge.accepted() if a.body["type"] == "lead.returned")
    assert returned_event == {
        "type": "lead.returned",
        "data": {
            "lead_id": "s1",
            "publisher_id": "surge",
            "payout": "4.00",
            "reason": "duplicate",
            "buyer_id": "acme",  # the sale returned (docs/api.md "Sales")
            "price": "40.00",
        },
    }
    arrivals = [a for r in (everything, wallets, surge, other) for a in r.arrivals]
    assert all(a.verified for a in arrivals)  # each signed with its endpoint's secret
    assert len({a.event_id for a in arrivals}) == len(arrivals) == 12  # a webhook-id per event and endpoint


def test_a_receiver_down_for_a_while_gets_every_event_once_in_order_when_back(api, receivers, engine_lock):
    app_side = receivers("a")
    put_endpoint(api, "app", app_side.url, secret=SECRETS["a"])
    app_side.stop()
    for n in range(6):
        credit(api, f"std-d{n}", 1_000 + n, customer=f"c{n % 2}@example.com")
        if n % 2:
            debit(api, f"rf-d{n}", f"std-d{n}", 10, customer=f"c{n % 2}@example.com")
        sell("surge", f"d{n}")
    deliver_inline(until=lambda: _attempted("app") >= 8)  # attempts fail and back off, nothing is lost
    with db.connection_context():
        assert events_log.backlog()["app"]["pending"] == 6 + 3 + 6
    app_side.start()
    deliver_inline()
    got = app_side.accepted()
    assert len(got) == 15 and len({a.event_id for a in got}) == 15 and all(a.verified for a in app_side.arrivals)
    per_customer = defaultdict(list)
    for a in got:
        if a.body["type"].startswith("wallet."):
            per_customer[a.body["data"]["customer"]].append(a.body["data"]["balance_minor"])
    # each wallet's events arrived in the order its changes committed: the balances follow
    assert per_customer == {
        "c0@example.com": [1_000, 2_002, 3_006],
        "c1@example.com": [1_001, 991, 1_994, 1_984, 2_989, 2_979],
    }


def _attempted(endpoint_id: str) -> int:
    with db.connection_context():
        return sum(d.attempts for d in EventDispatch.select().where(EventDispatch.endpoint_id == endpoint_id))


def test_a_paused_endpoint_keeps_its_events_and_sends_them_in_order_once_enabled(api, receivers, engine_lock):
    paused, live = receivers("a"), receivers("b")
    put_endpoint(api, "paused", paused.url, secret=SECRETS["a"], enabled=False)
    put_endpoint(api, "live", live.url, secret=SECRETS["b"])
    for n in range(5):
        credit(api, f"std-p{n}", 100 * (n + 1))
    deliver_inline()  # the live endpoint gets everything; the paused one nothing, all kept
    assert len(live.accepted()) == 5 and paused.arrivals == []
    shown = api.get("/v1/admin/event-endpoints/paused").json()
    assert (shown["enabled"], shown["disabled_reason"]) == (False, "paused")
    assert 'floodgate_event_endpoint_disabled{endpoint="paused",reason="paused"} 1.0' in api.get("/metrics").text
    assert 'floodgate_event_deliveries{endpoint="paused",status="pending"} 5.0' in api.get("/metrics").text
    put_endpoint(api, "paused", paused.url, enabled=True)
    deliver_inline()
    assert [a.body["data"]["balance_minor"] for a in paused.accepted()] == [100, 300, 600, 1000, 1500]
    assert [a.event_id for a in paused.accepted()] != [a.event_id for a in live.accepted()]


def test_an_endpoint_failing_past_the_window_is_disabled_keeps_everything_and_drains_when_enabled(
    api, receivers, engine_lock
):
    app_side = receivers("a")
    put_endpoint(api, "flaky", app_side.url, secret=SECRETS["a"])
    app_side.fail = lambda body: True
    credit(api, "std-x0", 1_000)

    def disabled() -> bool:
        with db.connection_context():
            return not endpoints.get("flaky").enabled

    deliver_inline(disable_after_s=1, until=disabled, timeout=30)
    for n in range(1, 4):  # written while it is disabled: kept, not sent
        credit(api, f"std-x{n}", 1_000)
    sell("surge", "x-lead")
    deliver_inline(until=lambda: events_log.not_fanned_out() == 0)
    shown = api.get("/v1/admin/event-endpoints/flaky").json()
    assert (shown["enabled"], shown["disabled_reason"], shown["last_error"]) == (False, "failing", "HTTP 500")
    metrics = api.get("/metrics").text
    assert 'floodgate_event_endpoint_disabled{endpoint="flaky",reason="failing"} 1.0' in metrics
    page = api.http.get(f"{api.base}/ops", headers=api.admin).text
    assert 'data-endpoint="flaky" data-state="disabled: failing"' in page and 'data-pending="5"' in page
    tried = len(app_side.arrivals)
    time.sleep(0.3)
    deliver_inline(until=lambda: True)
    assert len(app_side.arrivals) == tried  # disabled: nothing is attempted

    app_side.fail = None
    put_endpoint(api, "flaky", app_side.url, enabled=True)
    deliver_inline()
    got = subjects(app_side)
    assert [s for s in got if s.startswith("wallet.")] == [f"wallet.credited:std-x{n}" for n in range(4)]
    assert sorted(got) == sorted([f"wallet.credited:std-x{n}" for n in range(4)] + ["lead.sold:x-lead"])
    assert api.get("/v1/admin/event-endpoints/flaky").json()["disabled_reason"] is None


def test_replay_sends_an_endpoints_events_since_a_time_again_with_the_same_webhook_ids(api, receivers, engine_lock):
    app_side, other = receivers("a"), receivers("b")
    put_endpoint(api, "app", app_side.url, secret=SECRETS["a"])
    put_endpoint(api, "other", other.url, secret=SECRETS["b"])
    credit(api, "std-r0", 1_000)
    deliver_inline()
    cut = datetime.now(timezone.utc)
    time.sleep(0.01)
    credit(api, "std-r1", 2_000)
    sell("surge", "r-lead")
    deliver_inline()
    first = [(a.event_id, a.body) for a in app_side.accepted()]
    assert len(first) == 3

    url = f"{api.base}/v1/admin/event-endpoints/app/replay"
    resp = api.http.post(url, json={"since": cut.isoformat().replace("+00:00", "Z")}, headers=api.admin)
    assert (resp.status_code, resp.json()) == (202, {"replaying": 2})
    deliver_inline()
    again = [(a.event_id, a.body) for a in app_side.accepted()[3:]]
    assert sorted(again, key=str) == sorted(first[1:], key=str)  # the same webhook-ids and bodies
    assert len(other.accepted()) == 3  # another endpoint's deliveries are untouched
    for bad in ({}, {"since": "yesterday"}, {"since": "2026-01-01", "x": 1}, {"since": 5}):
        refused = api.http.post(url, json=bad, headers=api.admin)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_replay", bad
    missing = api.http.post(
        f"{api.base}/v1/admin/event-endpoints/none/replay", json={"since": "2026-01-01"}, headers=api.admin
    )
    assert missing.status_code == 404


def test_the_events_log_shows_every_attempt_and_filters(api, receivers, engine_lock):
    app_side, other = receivers("a"), receivers("b")
    put_endpoint(api, "app", app_side.url, secret=SECRETS["a"])
    put_endpoint(api, "other", other.url, secret=SECRETS["b"], types=["lead.sold"])
    failed = []  # the wallet event's first attempt fails
    app_side.fail = lambda body: body["type"] == "wallet.credited" and not failed and not failed.append(1)
    credit(api, "std-l0", 1_000)
    sell("surge", "l-lead")
    deliver_inline()

    everything = api.get("/v1/admin/events").json()
    assert [e["type"] for e in everything["events"]] == ["lead.sold", "wallet.credited"]  # newest first
    assert everything["next"] is None
    wallet_event = everything["events"][1]
    assert [(a["endpoint_id"], a["status_code"], a["error"]) for a in wallet_event["attempts"]] == [
        ("app", 500, "HTTP 500"),
        ("app", 204, None),
    ]
    assert all(isinstance(a["ms"], int) and a["at"].endswith("Z") for a in wallet_event["attempts"])
    assert [(d["endpoint_id"], d["status"], d["attempt_count"]) for d in wallet_event["deliveries"]] == [
        ("app", "delivered", 2)
    ]
    one = api.get(f"/v1/admin/events/{wallet_event['id']}").json()
    assert one == wallet_event
    assert api.get("/v1/admin/events/msg_none").status_code == 404

    def ids(**query) -> list[str]:
        resp = api.get("/v1/admin/events", params=query)
        assert resp.status_code == 200, resp.text
        return [e["type"] for e in resp.json()["events"]]

    assert ids(endpoint_id="other") == ["lead.sold"]
    assert ids(type="wallet.credited") == ["wallet.credited"]
    assert ids(status="failed") == [] and ids(status="delivered") == ["lead.sold", "wallet.credited"]
    assert ids(since=(utcnow() + timedelta(minutes=1)).isoformat()) == []
    page = api.get("/v1/admin/events", params={"limit": 1}).json()
    assert len(page["events"]) == 1 and page["next"] is not None
    rest = api.get("/v1/admin/events", params={"limit": 1, "before": page["next"]}).json()
    assert [e["type"] for e in rest["events"]] == ["wallet.credited"]
    led = api.get("/v1/admin/events", params={"endpoint_id": "other"}).json()["events"][0]
    assert {d["endpoint_id"] for d in led["deliveries"]} == {"other"}  # only that endpoint's
    for query in (
        {"type": "lead.bought"},
        {"status": "sent"},
        {"since": "soon"},
        {"limit": "0"},
        {"endpoint_id": "a b"},
    ):
        resp = api.get("/v1/admin/events", params=query)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_query", query


def test_a_queue_waiting_in_back_off_holds_the_events_that_join_it(api, receivers, engine_lock):
    """A new event of an entity whose earlier one waits is not sent before it (order per entity)."""
    app_side = receivers("a")
    put_endpoint(api, "app", app_side.url, secret=SECRETS["a"])
    app_side.fail = lambda body: body["data"]["reference"] == "std-q0"
    credit(api, "std-q0", 1_000)
    deliver_inline(until=lambda: _attempted("app") >= 2)
    credit(api, "std-q1", 1_000)  # same customer: behind std-q0
    credit(api, "std-q2", 1_000, customer="bo@example.com")  # another: not held
    deliver_inline(until=lambda: "wallet.credited:std-q2" in subjects(app_side))
    assert subjects(app_side) == ["wallet.credited:std-q2"]
    app_side.fail = None
    deliver_inline()
    assert subjects(app_side) == ["wallet.credited:std-q2", "wallet.credited:std-q0", "wallet.credited:std-q1"]
    assert Counter(a.body["data"]["reference"] for a in app_side.arrivals)["std-q1"] == 1
    assert json.dumps(app_side.accepted()[1].body).count("std-q0") == 1
