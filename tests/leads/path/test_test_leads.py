"""Test leads (docs/api.md "Publishers: limits, quality, test mode and payouts" `mode`): a lead
posted with `"test": true`, or any lead of a publisher in `mode: "test"`, goes through the spec,
the filters, caps and dedupe (read) and pings marked as a test, but is never posted, reserves
nothing, earns nothing and is counted nowhere; its answer says who would have bought it. Checked
in Redis and the ledger, not by the answer alone, with real buyers and real concurrency."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.leads.path.test_routing import PING, _bidder
from webhooks import services
from webhooks.storage.live import keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, Publisher

FIELDS = {"email": {"type": "email", "required": True}, "age": {"type": "integer", "min": 18}}


def floodgate_keys(api) -> set[str]:
    found = set(services.of(api.app).store.redis.scan_iter(match=keys.PREFIX + "*"))
    return found - {keys.ERASURES_SEEN}  # each journal's heartbeat (storage/erasures.py), not state


def balance(publisher_id: str) -> str:
    with db.connection_context():
        return f"{Publisher.get_by_id(publisher_id).balance:.2f}"


def test_a_test_lead_answers_who_would_buy_it_and_touches_nothing(api, buyer_server, worker):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge", commission_pct="10", fields=FIELDS)
    api.put_buyer(
        "acme", buyer_server.url("acme"), price="12.50", caps={"daily": 5}, dedupe={"fields": ["email"], "days": 1}
    )
    api.settle_config()
    before = floodgate_keys(api)
    resp = api.post_lead(key, {"lead_id": "t-1", "email": "Ada@Example.com", "age": "30", "test": True})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "lead_id": "t-1",
        "status": "sold",
        "buyer_id": "acme",
        "price": "12.50",
        "attempts": [],
        "test": True,
    }
    assert acme.received == []  # never posted
    assert api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == 0
    new_keys = floodgate_keys(api) - before
    # only the publisher's own claim of its lead id (its replay memory) and the settlement queue
    assert not any(":cap:" in k or ":dedupe:" in k or ":lease" in k or "round_robin" in k for k in new_keys), new_keys
    record = api.wait_settled("t-1", "surge")
    assert (record["status"], record["test"], record["buyer_id"], record["commission"]) == ("sold", True, "acme", None)
    assert balance("surge") == "0.00"
    again = api.post_lead(key, {"lead_id": "t-1", "email": "ada@example.com", "age": 30, "test": True}).json()
    assert again["replayed"] is True and again["test"] is True and acme.received == []
    # and the consumer is still new to the buyer: a live lead of the same e-mail is sold
    live = api.post_lead(key, {"lead_id": "l-1", "email": "ada@example.com", "age": 30}).json()
    assert live["status"] == "sold" and "test" not in live and len(acme.received) == 1


def test_a_test_lead_still_meets_the_spec_the_filters_caps_and_dedupe(api, buyer_server, worker):
    full, picky, dup, fallback = (buyer_server.add(n) for n in ("full", "picky", "dup", "fallback"))
    key = api.put_publisher("surge", fields=FIELDS)
    api.put_buyer("full", buyer_server.url("full"), priority=1, caps={"daily": 0})
    api.put_buyer("picky", buyer_server.url("picky"), priority=2, filter="age >= `40`")
    api.put_buyer("dup", buyer_server.url("dup"), priority=3, dedupe={"fields": ["email"], "days": 1})
    api.put_buyer("fallback", buyer_server.url("fallback"), priority=4)
    api.settle_config()
    sold = api.post_lead(key, {"lead_id": "seed", "email": "bo@example.com", "age": 30}).json()
    assert sold["buyer_id"] == "dup"  # a real sale: the consumer is now known to "dup"
    bad = api.post_lead(key, {"lead_id": "t-bad", "email": "nope", "test": True})
    assert bad.status_code == 400 and set(bad.json()["error"]["fields"]) == {"email"}
    answer = api.post_lead(key, {"lead_id": "t-2", "email": "bo@example.com", "age": 30, "test": True}).json()
    assert (answer["status"], answer["buyer_id"], answer["test"]) == ("sold", "fallback", True)
    record = api.wait_settled("t-2", "surge")
    reasons = {s["buyer_id"]: s["reason"] for s in record["skipped"]}
    assert reasons == {"full": "cap_full:daily", "picky": "filter", "dup": "duplicate"}
    assert [len(b.received) for b in (full, picky, dup, fallback)] == [0, 0, 1, 0]


def test_a_publisher_in_test_mode_sends_only_test_leads_and_pings_are_marked(api, buyer_server, worker):
    post, ping = _bidder(buyer_server, "bidder", "9.00")
    key = api.put_publisher("newbie", mode="test")
    assert api.get("/v1/admin/publishers/newbie").json()["mode"] == "test"
    api.put_buyer("bidder", buyer_server.url("bidder"), ping={**PING, "url": buyer_server.url("bidder/ping")})
    api.settle_config()
    answer = api.post_lead(key, {"lead_id": "n-1", "state": "TX", "zip": "73301"}).json()
    assert (answer["status"], answer["buyer_id"], answer["price"], answer["test"]) == ("sold", "bidder", "9.00", True)
    (pinged,) = ping.received
    assert pinged["headers"]["X-Floodgate-Test"] == "1"
    assert post.received == []
    assert api.wait_settled("n-1", "newbie")["test"] is True
    page = api.get("/ops").text  # the operator sees it is a test lead, and what it would be
    row = page[page.index('data-lead="n-1"') :].split("</tr>")[0]
    assert '<span class="test"' in row and "would be sold" in row


def test_concurrent_test_leads_leave_caps_dedupe_balances_and_buyers_untouched(api, buyer_server, worker):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge", commission_pct="10")
    api.put_buyer(
        "acme", buyer_server.url("acme"), price="10.00", caps={"daily": 3}, dedupe={"fields": ["email"], "days": 1}
    )
    api.settle_config()
    with ThreadPoolExecutor(32) as pool:
        answers = list(
            pool.map(
                lambda i: api.post_lead(key, {"lead_id": f"c-{i:03}", "email": f"p{i % 10}@x.io", "test": True}).json(),
                range(100),
            )
        )
    # nothing reserved: every one of them would have been bought, cap of 3 or not
    assert all((a["status"], a["buyer_id"], a["test"]) == ("sold", "acme", True) for a in answers), answers[:3]
    assert acme.received == []
    assert api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == 0
    assert not [k for k in floodgate_keys(api) if ":dedupe:" in k or ":cap:" in k]
    with db.connection_context():
        assert Lead.select().where(Lead.status == "sold").count() == 0
    assert balance("surge") == "0.00"
    # the cap is whole for live leads: three sold, then full
    live = [api.post_lead(key, {"lead_id": f"live-{i}", "email": f"q{i}@x.io"}).json()["status"] for i in range(4)]
    assert live == ["sold", "sold", "sold", "unsold"]


def test_a_test_lead_cannot_be_returned_and_test_must_be_a_boolean(api, buyer_server, worker):
    buyer_server.add("acme")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "r-1", "test": True}).json()["test"] is True
    api.wait_settled("r-1", "surge")
    resp = api.http.post(
        f"{api.base}/v1/admin/leads/r-1/return?publisher_id=surge", json={"reason": "test"}, headers=api.admin
    )
    assert (resp.status_code, resp.json()["error"]["code"]) == (409, "not_sold")
    bad = api.post_lead(key, {"lead_id": "r-2", "test": "yes"})
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_lead")
    refused = api.http.put(
        f"{api.base}/v1/admin/publishers/surge",
        json={"name": "Surge", "api_key": "pk_test_surge_0123456789", "mode": "sandbox"},
        headers=api.admin,
    )
    assert refused.status_code == 400 and "mode" in refused.json()["error"]["message"]
