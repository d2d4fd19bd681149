"""Routing (leads/path/routing.py): the buyers a lead may go to, the order each routing mode
offers them in, ping bids, and the waterfall that walks them. The pure parts on their own; the
rest through the API, against real HTTP buyers, Redis and database."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import gevent
import pytest

from testkit.servers import WebServer, post_lead_until_answered, sold_to
from tests.leads.posting.test_integration import _reply
from webhooks.leads.path.routing import Offer, attempt_view, buyer_body, candidates, fan_out, idempotency_key, order
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage.states import AttemptOutcome

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)


def rule(buyer_id: str, price: str = "10.00", priority: int = 1, weight: int = 1, **filters) -> BuyerRule:
    return BuyerRule(
        id=buyer_id,
        endpoint_url=f"http://127.0.0.1:9/{buyer_id}",
        priority=priority,
        price=Decimal(price),
        price_minor=int(Decimal(price) * 100),
        tz=ZoneInfo("UTC"),
        limits=(),
        states=frozenset(filters.get("states", ())),
        blocked=frozenset(filters.get("blocked", ())),
        schedule=filters.get("schedule"),
        weight=weight,
    )


def offers(*buyers: BuyerRule) -> list[Offer]:
    return [Offer(b, b.price) for b in buyers]


def ids(ordered: list[Offer]) -> list[str]:
    return [o.buyer.id for o in ordered]


def test_candidates_keep_the_buyers_order_and_trace_each_refusal():
    closed = tuple(() for _ in range(7))  # open no minute of any day
    buyers = (
        rule("texas", states={"TX"}),
        rule("blocker", blocked={"surge"}),
        rule("closed", schedule=closed),
        rule("any"),
    )
    passed, skipped = candidates(buyers, {"state": "tx"}, "surge", NOW, inactive=("off",))
    assert [b.id for b in passed] == ["texas", "any"]
    assert skipped == [
        {"buyer_id": "off", "reason": "inactive"},
        {"buyer_id": "blocker", "reason": "blocked_publisher"},
        {"buyer_id": "closed", "reason": "closed"},
    ]
    passed, skipped = candidates(buyers, {"state": "OK"}, "other", NOW)
    assert [b.id for b in passed] == ["blocker", "any"]
    assert [s["reason"] for s in skipped] == ["state", "closed"]


def test_the_waterfall_offers_by_priority_then_price_and_price_routing_by_price_alone():
    a, b, c, d = rule("a", "5.00", 1), rule("b", "9.00", 1), rule("c", "20.00", 2), rule("d", "9.00", 1)
    assert ids(order(offers(a, b, c, d), "waterfall")) == ["b", "d", "a", "c"]  # ties: by id
    assert ids(order(offers(a, b, c, d), "price")) == ["c", "b", "d", "a"]


def test_round_robin_rotates_each_priority_by_its_own_counter():
    a, b, c, d, e = (rule(n, priority=p) for n, p in (("a", 1), ("b", 1), ("c", 1), ("d", 2), ("e", 2)))
    assert ids(order(offers(a, b, c, d, e), "round_robin", {1: 0, 2: 0})) == ["a", "b", "c", "d", "e"]
    assert ids(order(offers(a, b, c, d, e), "round_robin", {1: 1, 2: 3})) == ["b", "c", "a", "e", "d"]
    assert ids(order(offers(a, b, c, d, e), "round_robin", {1: 5})) == ["c", "a", "b", "d", "e"]


def test_weighted_routing_leads_with_each_buyer_by_its_share_within_a_priority(monkeypatch):
    monkeypatch.setattr(random, "random", random.Random(61).random)
    w1, w3, later = rule("w1", weight=1), rule("w3", weight=3), rule("later", priority=2, weight=100)
    drawn = [order(offers(w1, w3, later), "weighted") for _ in range(4000)]
    assert all(ids(o)[2] == "later" for o in drawn)  # a lower priority always waits
    first = Counter(ids(o)[0] for o in drawn)
    assert abs(first["w3"] / 4000 - 0.75) <= 0.03, first


def test_a_buyer_receives_the_default_contract_with_the_lead_as_posted():
    lead_json = '{"state":"TX","extra":{"nested":[1,2]}}'
    body = buyer_body('id "1"', "surge", Decimal("12.50"), lead_json)
    assert json.loads(body) == {
        "lead_id": 'id "1"',
        "publisher_id": "surge",
        "price": "12.50",
        "lead": {"state": "TX", "extra": {"nested": [1, 2]}},
    }
    assert body.endswith(b'"lead":' + lead_json.encode() + b"}")  # the lead's bytes, not re-encoded
    assert Offer(rule("acme"), Decimal("12.50")).body('id "1"', "surge", {}, lead_json) == body
    assert idempotency_key("surge", "l-1", "acme") == "surge:l-1:acme"


def test_an_attempt_shows_a_bid_only_for_a_ping_buyer():
    assert attempt_view("a", None, AttemptOutcome.ACCEPTED, 12) == {"buyer_id": "a", "outcome": "accepted", "ms": 12}
    assert attempt_view("b", Decimal("9"), AttemptOutcome.REJECTED, 3)["bid"] == "9.00"


def test_fan_out_answers_in_order_with_none_for_a_call_that_failed_or_was_late():
    def boom() -> int:
        raise RuntimeError("ping failed")

    def late() -> int:  # waits as a buyer's reply does: on gevent's loop (webhooks/outbound.py)
        gevent.sleep(0.4)
        return 3

    assert fan_out([], 0.1) == []
    assert fan_out([lambda: 1], 0.1) == [1]
    assert fan_out([boom], 0.1) == [None]
    started = time.monotonic()
    assert fan_out([lambda: 1, boom, late, lambda: 4], 0.1) == [1, None, None, 4]
    assert time.monotonic() - started < 1.0


def test_filters_state_blocked_publisher_and_inactive(api, buyer_server):
    for name in ("texas", "blocker", "off", "any"):
        buyer_server.add(name)
    key = api.put_publisher("surge")
    api.put_buyer("texas", buyer_server.url("texas"), priority=1, states=["tx"])
    api.put_buyer("blocker", buyer_server.url("blocker"), priority=2, blocked_publishers=["surge"])
    api.put_buyer("off", buyer_server.url("off"), priority=3, active=False)
    api.put_buyer("any", buyer_server.url("any"), priority=4)
    api.settle_config()
    assert api.post_lead(key, {"state": "Tx"}).json()["buyer_id"] == "texas"
    ok = api.post_lead(key, {"state": "OK"}).json()
    assert ok["buyer_id"] == "any" and len(ok["attempts"]) == 1  # filtered buyers are not attempts
    assert api.post_lead(key, {}).json()["buyer_id"] == "any"
    assert not buyer_server.buyers["blocker"].received and not buyer_server.buyers["off"].received


def test_waterfall_priority_order_ties_by_price_and_cascade(api, buyer_server):
    buyer_server.add("cheap", "reject")
    buyer_server.add("rich", "error500")
    buyer_server.add("last", "accept")
    buyer_server.add("never", "accept")
    key = api.put_publisher("surge")
    api.put_buyer("cheap", buyer_server.url("cheap"), priority=1, price="5.00")
    api.put_buyer("rich", buyer_server.url("rich"), priority=1, price="9.00")
    api.put_buyer("last", buyer_server.url("last"), priority=2, price="1.00")
    api.put_buyer("never", buyer_server.url("never"), priority=3, price="99.00")
    api.settle_config()
    body = api.post_lead(key, {"lead_id": "w1"}).json()
    assert [(a["buyer_id"], a["outcome"]) for a in body["attempts"]] == [
        ("rich", "error"),
        ("cheap", "rejected"),
        ("last", "accepted"),
    ]
    assert body["buyer_id"] == "last" and body["price"] == "1.00"
    assert not buyer_server.buyers["never"].received


PING = {"fields": {"state": "{{ lead.state }}", "zip": "{{ lead.zip }}"}, "bid": "price", "min_bid": "3.00"}
POST_WITH_BID_ID = {"fields": {"bid_id": "{{ ping.bid_id }}", "price": "{{ price }}", "email": "{{ lead.email }}"}}


def _bidder(buyer_server, name: str, bid: str):
    post, ping = buyer_server.add(name), buyer_server.add(f"{name}/ping")
    _reply(ping, {"price": bid, "bid_id": f"{name}-bid"})
    return post, ping


def test_ping_post_under_price_routing_sells_to_the_best_bid_within_its_budget(api, buyer_server, worker):
    hi, hi_ping = _bidder(buyer_server, "hi", "12.00")
    mid, mid_ping = _bidder(buyer_server, "mid", "9.00")
    low, low_ping = _bidder(buyer_server, "low", "2.50")  # under its min_bid: never posted
    buyer_server.add("fixed")
    key = api.put_publisher("surge", routing="price", commission_pct="10")
    url = buyer_server.url
    api.put_buyer(
        "hi",
        url("hi"),
        priority=3,
        price="1.00",
        ping={**PING, "url": url("hi/ping")},
        delivery=POST_WITH_BID_ID,
        caps={"daily_budget": "60.00"},
    )
    api.put_buyer("mid", url("mid"), priority=1, price="1.00", ping={**PING, "url": url("mid/ping")})
    api.put_buyer("low", url("low"), priority=1, price="1.00", ping={**PING, "url": url("low/ping")})
    api.put_buyer("fixed", url("fixed"), priority=2, price="10.00")
    api.settle_config()

    def post(i: int) -> dict:
        resp = api.session().post(
            f"{api.base}/v1/leads",
            json={"lead_id": f"pp{i}", "state": "TX", "email": f"c{i}@x.io"},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert resp.status_code == 200, resp.text
        return resp.json()

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(post, range(30)))
    sold = Counter((a["buyer_id"], a["price"]) for a in answers)
    assert sold == {("hi", "12.00"): 5, ("fixed", "10.00"): 25}  # 60.00 / 12.00 = 5, then the next best
    assert len(hi.received) == 5 and len(low.received) == 0 and len(low_ping.received) > 0
    assert {r["body"]["bid_id"] for r in hi.received} == {"hi-bid"}  # the post carries the ping's value
    assert {r["body"]["price"] for r in hi.received} == {"12.00"}
    hi_attempt = next(a for a in answers if a["buyer_id"] == "hi")["attempts"][-1]
    assert hi_attempt == {"buyer_id": "hi", "outcome": "accepted", "ms": hi_attempt["ms"], "bid": "12.00"}
    assert api.get("/v1/admin/buyers/hi").json()["usage"]["daily_budget"]["used"] == "60.00"
    pings = len(hi_ping.received)
    body = post(99)  # hi is full now: not even pinged
    assert len(hi_ping.received) == pings and body["buyer_id"] == "fixed"
    record = api.wait_settled(next(a["lead_id"] for a in answers if a["buyer_id"] == "hi"), "surge")
    assert record["price"] == "12.00" and record["commission"] == "1.20"
    assert {"buyer_id": "low", "reason": "no_bid"} in record["skipped"]
    assert record["attempts"][-1]["bid"] == "12.00"


def test_a_ping_that_times_out_or_fails_means_no_bid(api, buyer_server):
    slow_post, slow_ping = _bidder(buyer_server, "slow", "20.00")
    slow_ping.delay = 1.0  # past PING_TIMEOUT_MS (300)
    bad_post, bad_ping = _bidder(buyer_server, "bad", "20.00")
    _reply(bad_ping, {"error": "nope"}, status=500)
    buyer_server.add("fixed")
    key = api.put_publisher("surge", routing="price")
    url = buyer_server.url
    api.put_buyer("slow", url("slow"), price="1.00", ping={**PING, "url": url("slow/ping")})
    api.put_buyer("bad", url("bad"), price="1.00", ping={**PING, "url": url("bad/ping")})
    api.put_buyer("fixed", url("fixed"), price="5.00")
    api.settle_config()
    body = api.post_lead(key, {"lead_id": "t1"}).json()
    assert body["buyer_id"] == "fixed" and slow_post.received == [] and bad_post.received == []


def _round_robin_shares(api, buyer_server, bases: list[str]) -> Counter:
    """300 leads from 30 threads (spread over `bases`) to 3 buyers of one priority."""
    for name in ("r1", "r2", "r3"):
        buyer_server.add(name)
    key = api.put_publisher("surge", routing="round_robin")
    for name in ("r1", "r2", "r3"):
        api.put_buyer(name, buyer_server.url(name), priority=1)
    api.settle_config()
    local = threading.local()

    def one(i: int) -> dict:
        s = getattr(local, "s", None) or api.session()
        local.s = s
        return s.post(
            f"{bases[i % len(bases)]}/v1/leads",
            json={"lead_id": f"rr{i}"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        ).json()

    with ThreadPoolExecutor(30) as pool:
        return Counter(a["buyer_id"] for a in pool.map(one, range(300)))


def test_round_robin_rotates_within_a_priority(api, buyer_server):
    shares = _round_robin_shares(api, buyer_server, [api.base])
    assert all(97 <= shares[name] <= 103 for name in ("r1", "r2", "r3")), shares


@pytest.mark.e2e
def test_round_robin_is_shared_by_two_web_processes(web_api, base_env, tmp_path, buyer_server):
    second = WebServer(base_env, tmp_path / "web2.log", workers=2)
    try:
        shares = _round_robin_shares(web_api, buyer_server, [web_api.base, second.url])
        assert all(97 <= shares[name] <= 103 for name in ("r1", "r2", "r3")), shares
    finally:
        second.stop()


def test_weighted_routing_draws_by_weight(api, buyer_server):
    buyer_server.add("w1")
    buyer_server.add("w3")
    key = api.put_publisher("surge", routing="weighted")
    api.put_buyer("w1", buyer_server.url("w1"), priority=1, weight=1)
    api.put_buyer("w3", buyer_server.url("w3"), priority=1, weight=3)
    api.put_buyer("later", buyer_server.url("later"), priority=2, weight=100)  # a lower priority waits
    api.settle_config()
    with ThreadPoolExecutor(20) as pool:
        answers = list(
            pool.map(lambda i: post_lead_until_answered(api.session(), api.base, key, {"lead_id": f"w{i}"}), range(400))
        )
    # a lower priority is offered a lead only after the first one failed it (a post the deadline
    # cut off, on a busy machine); the draw is the buyer each lead was offered first
    assert all(a["attempts"][0]["outcome"] != "accepted" for a in answers if a["buyer_id"] == "later")
    shares = Counter(a["attempts"][0]["buyer_id"] for a in answers)
    assert shares["later"] == 0
    assert abs(shares["w3"] / 400 - 0.75) <= 0.1 and abs(shares["w1"] / 400 - 0.25) <= 0.1, shares


@pytest.mark.parametrize("mode", ["price", "round_robin", "weighted"])
def test_caps_stay_exact_under_every_routing_mode(api, buyer_server, mode):
    for name in ("a", "b"):
        buyer_server.add(name)
    key = api.put_publisher("surge", routing=mode)
    api.put_buyer("a", buyer_server.url("a"), priority=1, caps={"daily": 7}, weight=2)
    api.put_buyer("b", buyer_server.url("b"), priority=1, caps={"daily": 5}, price="11.00")
    api.settle_config()
    with ThreadPoolExecutor(20) as pool:
        answers = list(
            pool.map(
                lambda i: post_lead_until_answered(api.session(), api.base, key, {"lead_id": f"c{i}"}),
                range(40),
            )
        )
    for name, cap in (("a", 7), ("b", 5)):  # a post the deadline cut off: accepted by the stub, unsold
        sold_to(name, buyer_server.buyers[name], answers, cap=cap)
