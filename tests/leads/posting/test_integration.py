"""Buyer integrations (docs/api.md "Buyer integrations"): post templates and accept rules, the
preview, ping/post bidding and routing modes, against real HTTP buyers, Redis and database."""

from __future__ import annotations

import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from urllib.parse import parse_qs

import pytest

from testkit.servers import WebServer, post_lead_until_answered, sold_to
from tests.conftest import Api

FORM = {
    "method": "POST",
    "format": "form",
    "headers": {"X-Api-Key": "sk_acme_secret_1234"},
    "fields": {
        "email": "{{ lead.email }}",
        "name": "{{ lead.first_name }} {{ lead.last_name }}",
        "source": "{{ publisher_id }}",
        "ref": "{{ lead_id }}",
        "bid": "{{ price }}",
        "vendor": "floodgate",
    },
    "accept": "result == 'success'",
}


def _reply(buyer, body, status=200, ctype="application/json"):
    buyer.mode = "reply"
    buyer.reply = (status, body if isinstance(body, bytes) else json.dumps(body).encode(), ctype)


def test_a_form_post_with_a_header_credential_judged_by_a_jmespath_rule(api, buyer_server):
    acme = buyer_server.add("acme")
    _reply(acme, {"result": "success", "id": 77})
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"), price="12.50", delivery=FORM)
    api.settle_config()
    lead = {"lead_id": "f1", "email": "ada@example.com", "first_name": "Ada", "last_name": "Lovelace"}
    body = api.post_lead(key, lead).json()
    assert body["status"] == "sold" and body["price"] == "12.50"
    [got] = acme.received
    assert got["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert got["headers"]["X-Api-Key"] == "sk_acme_secret_1234" and got["headers"]["Idempotency-Key"] == "surge:f1:acme"
    assert parse_qs(got["raw"].decode()) == {
        "email": ["ada@example.com"],
        "name": ["Ada Lovelace"],
        "source": ["surge"],
        "ref": ["f1"],
        "bid": ["12.50"],
        "vendor": ["floodgate"],
    }
    _reply(acme, {"result": "duplicate"})  # 2xx, but the rule says no
    assert api.post_lead(key, {"lead_id": "f2"}).json()["attempts"][0]["outcome"] == "rejected"
    _reply(acme, b"<html>", ctype="text/html")  # a 2xx the rule cannot read: an error
    assert api.post_lead(key, {"lead_id": "f3"}).json()["attempts"][0]["outcome"] == "error"


def test_a_text_reply_judged_by_accept_regex_and_a_json_post_keeping_types(api, buyer_server):
    xml = buyer_server.add("xml")
    _reply(xml, b"<response><status>ACCEPTED</status></response>", ctype="application/xml")
    key = api.put_publisher("surge")
    api.put_buyer(
        "xml",
        buyer_server.url("xml"),
        delivery={
            "method": "PUT",
            "fields": {
                "age": "{{ lead.age }}",
                "zip": "{{ lead.zip }}",
                "note": "age {{ lead.age }}",
                "missing": "{{ lead.nothing }}",
                "deep": "{{ ping.bid_id }}",
            },
            "accept_regex": "<status>ACCEPTED</status>",
        },
    )
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "x1", "age": 42, "zip": "73301"}).json()["status"] == "sold"
    [got] = xml.received
    assert got["method"] == "PUT" and got["headers"]["Content-Type"] == "application/json"
    assert got["body"] == {"age": 42, "zip": "73301", "note": "age 42", "missing": None, "deep": None}
    _reply(xml, b"<response><status>REJECTED</status></response>", ctype="application/xml")
    assert api.post_lead(key, {"lead_id": "x2"}).json()["status"] == "unsold"


@pytest.mark.parametrize(
    "template",
    [
        "{{ lead.email ",
        "{% for %}",
        "{{ ''.__class__.__mro__ }}",
        "x {{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ lead.__class__ }}",
        "{{ (lead.get).__self__.__class__ }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ [''.__class__] }}",
        "{{ lead.pop('email') }}",
        "{{ lead.update({'email': ''}) }}",
    ],
)
def test_templates_that_do_not_parse_or_escape_the_sandbox_are_refused_at_put(api, buyer_server, template):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/evil",
        headers=api.admin,
        json={
            "name": "Evil",
            "endpoint_url": buyer_server.url("evil"),
            "price": "1.00",
            "delivery": {"fields": {"x": template}},
        },
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_buyer" and "delivery.fields.x" in error["message"]
    assert api.get("/v1/admin/buyers/evil").status_code == 404  # nothing stored


@pytest.mark.parametrize(
    "delivery, field",
    [
        ({"accept": "result =="}, "delivery.accept"),
        ({"accept_regex": "("}, "delivery.accept_regex"),
        ({"format": "xml"}, "delivery.format"),
        ({"method": "GET"}, "delivery.method"),
        ({"headers": {"Content-Type": "text/plain"}}, "delivery.headers.Content-Type"),
        ({"headers": {"X-A": "a\r\nX-B: b"}}, "delivery.headers.X-A"),
        ({"fields": {}}, "delivery.fields"),
    ],
)
def test_bad_delivery_settings_are_refused_naming_the_field(api, delivery, field):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/b",
        headers=api.admin,
        json={"name": "B", "endpoint_url": "http://127.0.0.1:9/", "price": "1.00", "delivery": delivery},
    )
    assert resp.status_code == 400 and field in resp.json()["error"]["message"], resp.text


def test_header_secrets_are_redacted_on_get_and_kept_when_the_redacted_form_comes_back(api, buyer_server):
    acme = buyer_server.add("acme")
    _reply(acme, {"result": "success"})
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"), delivery=FORM)
    got = api.get("/v1/admin/buyers/acme").json()
    assert got["delivery"]["headers"] == {"X-Api-Key": "****1234"}
    put_back = {k: v for k, v in got.items() if k not in ("usage",)}
    put_back["price"] = "11.00"
    assert api.http.put(f"{api.base}/v1/admin/buyers/acme", json=put_back, headers=api.admin).status_code == 200
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "h1"}).json()["status"] == "sold"
    assert acme.received[0]["headers"]["X-Api-Key"] == "sk_acme_secret_1234"  # the stored secret, kept


def test_preview_shows_the_request_and_sends_reserves_stores_nothing(api, buyer_server):
    acme = buyer_server.add("acme")
    api.put_buyer("acme", buyer_server.url("acme"), price="12.50", caps={"daily": 1}, delivery=FORM)
    resp = api.http.post(
        f"{api.base}/v1/admin/buyers/acme/preview",
        headers=api.admin,
        json={"lead_id": "p1", "email": "ada@example.com", "first_name": "Ada"},
    )
    assert resp.status_code == 200, resp.text
    preview = resp.json()
    assert preview["method"] == "POST" and preview["url"] == buyer_server.url("acme")
    assert preview["headers"]["X-Api-Key"] == "****1234"
    assert preview["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert parse_qs(preview["body"])["email"] == ["ada@example.com"]
    assert acme.received == [] and acme.arrived == []
    assert api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == 0


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


def test_bad_routing_mode_and_weight_are_refused(api):
    resp = api.http.put(
        f"{api.base}/v1/admin/publishers/p",
        headers=api.admin,
        json={"name": "P", "api_key": "pk_test_0123456789abcdef", "routing": "random"},
    )
    assert resp.status_code == 400 and "routing" in resp.json()["error"]["message"]
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/b",
        headers=api.admin,
        json={"name": "B", "endpoint_url": "http://127.0.0.1:9/", "price": "1.00", "weight": 0},
    )
    assert resp.status_code == 400 and "weight" in resp.json()["error"]["message"]


def test_demo_buyer_quick_start_sells_a_lead(api, app):
    """The README's quick start: the demo buyer of `flask --app wsgi demo-buyer` accepts."""
    from testkit.servers import free_port, wait_until
    from webhooks import demo_buyer

    port = free_port()
    threading.Thread(target=demo_buyer.serve, args=("127.0.0.1", port), daemon=True).start()
    key = api.put_publisher("surge")
    api.put_buyer(
        "acme",
        f"http://127.0.0.1:{port}/acme",
        price="12.50",
        states=["TX", "OK"],
        caps={"hourly": 10, "daily": 100, "daily_budget": "900.00"},
    )
    api.settle_config()
    body = wait_until(
        lambda: (
            (r := api.post_lead(key, {"lead_id": "surge-1", "state": "TX"}).json()) and r.get("status") == "sold" and r
        ),
        what="a sale to the demo buyer",
    )
    assert body["buyer_id"] == "acme" and Decimal(body["price"]) == Decimal("12.50")


def test_api_keeps_working_without_integrations(api: Api, buyer_server):
    """The default contract is unchanged for a buyer without delivery or ping."""
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "d1", "state": "TX"}).json()["status"] == "sold"
    assert acme.received[0]["body"] == {
        "lead_id": "d1",
        "publisher_id": "surge",
        "price": "10.00",
        "lead": {"state": "TX"},
    }


def test_a_reply_nested_past_pythons_stack_is_an_error_not_a_500(api, buyer_server):
    deep = buyer_server.add("deep")
    buyer_server.add("plain")
    _reply(deep, b"[" * 100_000 + b"]" * 100_000)
    key = api.put_publisher("surge")
    api.put_buyer("deep", buyer_server.url("deep"), priority=1)
    api.put_buyer("plain", buyer_server.url("plain"), priority=2)
    api.settle_config()
    resp = api.post_lead(key, {"lead_id": "deep-1"})
    assert resp.status_code == 200, resp.text
    outcomes = [(a["buyer_id"], a["outcome"]) for a in resp.json()["attempts"]]
    assert outcomes == [("deep", "error"), ("plain", "accepted")]
