"""Buyer integrations (docs/api.md "Buyer integrations"): post templates and accept rules and the
preview, against real HTTP buyers, Redis and database (ping bids and routing modes:
tests/leads/path/test_routing.py)."""

from __future__ import annotations

import json
import threading
from decimal import Decimal
from urllib.parse import parse_qs

import pytest

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
