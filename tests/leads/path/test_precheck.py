"""Pre-ping (docs/api.md "Consent, suppression and pre-ping"): POST /v1/leads/check answers
whether a lead would be taken now and whether its lead_id was sent before, with the same
authentication, rate limit, field spec and filters as a lead, and only reads (but for its
publisher's pre-ping counter): every other Redis key, the buyers' counters and the ledger are
compared before and after, and no buyer is called (nor pinged). Against the real app, Redis
and database. The quota and what the answer may not tell: test_precheck_quota.py."""

from __future__ import annotations

import hashlib

import pytest

from testkit.roundtrips import pipelines_of
from testkit.trustedform import API_KEY, TrustedFormStandIn
from webhooks import services
from webhooks.storage.live import keys as keys_module
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead

PING = {"fields": {"state": "{{ lead.state }}"}, "bid": "price", "min_bid": "3.00"}
CERT = "https://cert.trustedform.com/" + "ab" * 20


def check(api, key: str, body: dict):
    return api.http.post(
        f"{api.base}/v1/leads/check", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def state(redis_server) -> dict:
    """Every Floodgate key of the run's Redis with its value (a dump; the settlement queue
    among them), RQ's queues, and the ledger's leads. (Not RQ's worker keys: a worker of the
    session, idle, beats its heartbeat into them meanwhile; nor the publishers' pre-ping
    counters, which each pre-ping counts in, nor the journals' heartbeat of erasures read.)"""
    r = redis_server.client(decode_responses=False)
    keys = sorted(
        k
        for k in r.keys(keys_module.PREFIX + "*") + r.keys("rq:queue:*")
        if b":precheck:" not in k
        and k != keys_module.ERASURES_SEEN.encode()  # each journal's heartbeat (storage/erasures.py)
    )
    with db.connection_context():
        leads = sorted((x.publisher_id, x.lead_id, x.status) for x in Lead.select())
    return {"redis": {k: r.dump(k) for k in keys}, "ledger": leads}


def usage(api, *buyers: str) -> dict:
    return {b: api.get(f"/v1/admin/buyers/{b}").json()["usage"] for b in buyers}


def nobody_called(buyer_server) -> bool:
    return all(not b.arrived for b in buyer_server.buyers.values())


@pytest.fixture
def network(api, buyer_server):
    """Publisher `pub` (caps: 3 a day) and four buyers: `fixed` (dedupes on email), `bidder`
    (ping/post), `texas` (TX leads only) and `spare`, which suppresses the list `dnc`."""
    for name in ("fixed", "bidder", "texas", "spare"):
        buyer_server.add(name)
    resp = api.http.put(
        f"{api.base}/v1/admin/suppression-lists/dnc", json={"field": "email", "hash": "md5"}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text
    key = api.put_publisher(
        "pub", caps={"daily": 3}, fields={"email": {"type": "email", "required": True}, "age": {"type": "integer"}}
    )
    api.put_buyer("fixed", buyer_server.url("fixed"), priority=1, dedupe={"fields": ["email"], "days": 30})
    api.put_buyer(
        "bidder", buyer_server.url("bidder"), priority=2, ping={**PING, "url": buyer_server.url("bidder/ping")}
    )
    api.put_buyer("texas", buyer_server.url("texas"), priority=3, states=["TX"])
    api.put_buyer("spare", buyer_server.url("spare"), priority=4, suppress=["dnc"])
    api.settle_config()
    return key


def test_a_pre_ping_answers_two_booleans_and_changes_nothing(api, network, buyer_server, redis_server):
    check(api, network, {"lead_id": "warm", "email": "warm@example.com"})  # the config is read once
    before, counters = state(redis_server), usage(api, "fixed", "bidder", "texas", "spare")

    eligible = check(api, network, {"lead_id": "e-1", "email": "ada@example.com", "state": "CA"})
    assert (eligible.status_code, eligible.json()) == (200, {"eligible": True, "duplicate": False})
    texan = check(api, network, {"email": "bob@example.com", "state": "TX", "test": True})  # no lead_id: a fresh one
    assert texan.text == eligible.text  # no count of buyers: one more buyer takes Texans

    assert state(redis_server) == before  # nothing claimed, reserved, counted or stored
    assert usage(api, "fixed", "bidder", "texas", "spare") == counters
    assert nobody_called(buyer_server)  # no post, and no ping either


def test_the_same_authentication_spec_and_rate_limit_as_a_lead(api, network, buyer_server):
    assert check(api, "pk_wrong_0123456789", {"email": "a@example.com"}).status_code == 401
    bad = check(api, network, {"lead_id": "x", "email": "not an e-mail", "age": "old"})
    assert bad.status_code == 400 and set(bad.json()["error"]["fields"]) == {"email", "age"}
    assert check(api, network, {"lead_id": "x y", "email": "a@example.com"}).json()["error"]["code"] == "invalid_lead"
    assert check(api, network, ["not", "an", "object"]).status_code == 400
    limited = api.put_publisher("slow", rate_limit={"per_second": 1, "burst": 2})
    api.settle_config()
    answers = [check(api, limited, {"lead_id": f"r{i}"}).status_code for i in range(3)]
    assert answers == [200, 200, 429]
    assert api.post_lead(limited, {"lead_id": "r9"}).status_code == 429  # one bucket for both
    assert nobody_called(buyer_server)


def test_a_lead_id_sent_before_is_a_duplicate_and_a_consumer_bought_before_is_not(api, network, buyer_server, worker):
    sold = api.post_lead(network, {"lead_id": "d-1", "email": "cy@example.com"}).json()
    assert (sold["status"], sold["buyer_id"]) == ("sold", "fixed")
    called = len(buyer_server.buyers["fixed"].arrived)

    # the same lead again: a post would be its replay
    assert check(api, network, {"lead_id": "d-1", "email": "cy@example.com"}).json() == {
        "eligible": False,
        "duplicate": True,
    }
    # a new lead of the same consumer: `fixed` has bought it (dedupe) and has no room for it;
    # the others would take it. The sale is not told (docs/leads.md "What a pre-ping may tell").
    assert check(api, network, {"lead_id": "d-2", "email": "CY@example.com"}).json() == {
        "eligible": True,
        "duplicate": False,
    }
    # once settled and the claim is gone from Redis, the ledger still knows the lead
    api.wait_settled("d-1", "pub")
    assert len(buyer_server.buyers["fixed"].arrived) == called


def test_suppressed_and_capped_leads_are_not_eligible(api, network, buyer_server, redis_server):
    listed = hashlib.md5(b"dee@example.com").hexdigest()
    resp = api.http.post(
        f"{api.base}/v1/admin/suppression-lists/dnc/entries", json={"add": [listed]}, headers=api.admin
    )
    assert resp.status_code == 200
    # a buyer's list: that buyer would not be offered it, the others would
    assert check(api, network, {"email": "dee@example.com"}).json() == {"eligible": True, "duplicate": False}
    # a publisher's list: refused before routing, as its post would be
    strict = api.put_publisher("strict", suppress=["dnc"])
    api.settle_config()
    before = state(redis_server)
    assert check(api, strict, {"email": "Dee@Example.com"}).json() == {"eligible": False, "duplicate": False}
    assert check(api, strict, {"email": "eve@example.com"}).json()["eligible"] is True
    assert state(redis_server) == before

    # the publisher's daily cap of 3: full after three leads, a pre-ping says so
    for i in range(3):
        assert api.post_lead(network, {"lead_id": f"c-{i}", "email": f"c{i}@example.com"}).status_code == 200
    assert api.post_lead(network, {"lead_id": "c-3", "email": "c3@example.com"}).status_code == 429
    assert check(api, network, {"lead_id": "c-4", "email": "c4@example.com"}).json() == {
        "eligible": False,
        "duplicate": False,
    }


def test_full_caps_and_an_empty_balance_leave_no_buyer_with_room(api, buyer_server, reconfigure, worker):
    reconfigure(payment_account_field="account_id")
    buyer_server.add("small")
    buyer_server.add("billed")
    key = api.put_publisher("pub")
    api.put_buyer("small", buyer_server.url("small"), priority=1, caps={"daily": 1})
    billing = {"mode": "prepaid", "account": "acct-billed", "currency": "NGN"}
    api.put_buyer("billed", buyer_server.url("billed"), priority=2, billing=billing)
    api.settle_config()
    # `billed` has no money: only `small` has room
    assert check(api, key, {"lead_id": "b-1"}).json() == {"eligible": True, "duplicate": False}
    assert api.post_lead(key, {"lead_id": "b-1"}).json()["buyer_id"] == "small"
    # `small` is at its cap now, and `billed` still cannot pay
    assert check(api, key, {"lead_id": "b-2"}).json() == {"eligible": False, "duplicate": False}
    assert api.post_lead(key, {"lead_id": "b-2"}).json()["status"] == "unsold"


def test_a_buyer_requiring_consent_is_offered_only_a_lead_carrying_it(api, buyer_server, reconfigure):
    standin = TrustedFormStandIn()
    try:
        reconfigure(trustedform_api_base=standin.url, trustedform_api_key=API_KEY)
        buyer_server.add("needs")
        buyer_server.add("texan")
        key = api.put_publisher("pub", fields={"cert": {"type": "trustedform_cert"}})
        api.put_buyer("needs", buyer_server.url("needs"), priority=1, require_consent=["trustedform"])
        api.put_buyer("texan", buyer_server.url("texan"), priority=2, states=["TX"])
        api.settle_config()
        # not from Texas: `needs` alone could take it, with the evidence only
        assert check(api, key, {"cert": CERT, "email": "ada@example.com"}).json() == {
            "eligible": True,
            "duplicate": False,
        }
        assert check(api, key, {}).json()["eligible"] is False
        assert check(api, key, {"state": "TX"}).json()["eligible"] is True
        assert standin.requests == []  # no claim is made for a pre-ping
        assert check(api, key, {"cert": CERT}).json()["eligible"] is False  # no e-mail or phone to match it with
        # a test lead makes no claim either: it would go to `needs` only with the evidence
        tried = api.post_lead(key, {"cert": CERT, "email": "ada@example.com", "test": True}).json()
        assert tried["buyer_id"] == "needs"
        assert (
            api.post_lead(key, {"email": "ada@example.com", "state": "TX", "test": True}).json()["buyer_id"] == "texan"
        )
        assert standin.requests == []
        reconfigure(trustedform_api_key="")  # no key, no claim: such a buyer gets no lead
        assert check(api, key, {"cert": CERT, "email": "ada@example.com"}).json()["eligible"] is False
    finally:
        standin.close()


def test_a_pre_ping_costs_no_more_redis_round_trips_than_a_test_lead(api, network, app):
    store = services.of(app).store
    check(api, network, {"lead_id": "warm", "email": "w@example.com"})
    with pipelines_of(store.redis) as trips:
        assert check(api, network, {"lead_id": "t-1", "email": "t@example.com"}).status_code == 200
        pre_ping = len(trips)
        trips.clear()
        assert api.post_lead(network, {"lead_id": "t-2", "email": "t@example.com", "test": True}).status_code == 200
        test_lead = len(trips)
    assert 0 < pre_ping <= test_lead
