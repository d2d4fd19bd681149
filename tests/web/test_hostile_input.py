"""Hostile input costs its sender alone (issue: one valid publisher key must not take the
service down): full-match ids, requests Floodgate cannot build never move a buyer's breaker,
caller request ids only when they are ids, bounded replies, templates and journal, the ops
pages' CSP and logout, and secrets kept out of the audit log, logs and stored errors."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from redis import Redis

from testkit import ops
from tests.conftest import ADMIN_TOKEN
from webhooks.storage.live import keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, Lead

BAD_IDS = ["nl1\n", "nl1\r\n", "a b", "x" * 65, "caf\u00e9", "tab\t", "", "semi;colon", "nul\x00", "\n"]
# A field template that is cheap on the sample lead and explodes on this one: a loop bound by
# the lead (Jinja's sandbox lets range() go to 100,000), each turn writing a long field.
EXPLODING = {
    "fields": {
        "email": "{{ lead.email }}",
        "pad": "{% for i in range(lead.n|default('1')|int) %}{{ lead.pad }}{% endfor %}",
    }
}


def _breaker(redis_server, buyer_id: str) -> dict:
    return redis_server.client().hgetall(keys.breaker(buyer_id))


@pytest.mark.parametrize("lead_id", BAD_IDS)
def test_a_lead_id_that_is_not_an_id_in_full_is_refused(api, buyer_server, lead_id):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    resp = api.post_lead(key, {"lead_id": lead_id, "state": "TX"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_lead" and not acme.received


def test_leads_with_bad_ids_never_open_a_buyers_circuit(api, buyer_server, redis_server):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge")
    other = api.put_publisher("calm")
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    for i in range(10):  # BREAKER_FAILURES is 3 in the tests: three would have opened it
        assert api.post_lead(key, {"lead_id": f"nl{i}\n"}).status_code == 400
    assert _breaker(redis_server, "acme") == {} and not acme.received
    body = api.post_lead(other, {"lead_id": "calm-1"}).json()
    assert body["status"] == "sold" and body["buyer_id"] == "acme"


def test_path_ids_with_a_trailing_newline_are_not_found(api):
    for path in ("/v1/admin/buyers/acme%0A", "/v1/admin/publishers/surge%0A", "/v1/admin/leads/x%0A"):
        resp = api.get(path)
        assert resp.status_code in (400, 404) and resp.json()["error"]["code"] in ("bad_request", "not_found")


def test_a_post_its_template_cannot_render_within_budget_skips_the_buyer_and_moves_no_breaker(
    api, buyer_server, redis_server, worker
):
    fancy, plain = buyer_server.add("fancy"), buyer_server.add("plain")
    key = api.put_publisher("surge")
    api.put_buyer("fancy", buyer_server.url("fancy"), priority=1, caps={"hourly": 100}, delivery=EXPLODING)
    api.put_buyer("plain", buyer_server.url("plain"), priority=2)
    api.settle_config()
    for i in range(6):
        body = api.post_lead(key, {"lead_id": f"big-{i}", "n": "100000", "pad": "p" * 200}).json()
        assert body["status"] == "sold" and body["buyer_id"] == "plain", body
        assert [a["buyer_id"] for a in body["attempts"]] == ["plain"]  # fancy was no attempt
    assert not fancy.received and len(plain.received) == 6 and _breaker(redis_server, "fancy") == {}
    assert api.get("/v1/admin/buyers/fancy").json()["usage"]["hourly"]["used"] == 0  # every slot given back
    record = api.wait_settled("big-0", "surge")
    assert {"buyer_id": "fancy", "reason": "request_not_built"} in record["skipped"]
    # the same buyer takes an honest lead of the same template
    body = api.post_lead(key, {"lead_id": "small", "n": "2", "pad": "ok", "email": "a@b.co"}).json()
    assert body["buyer_id"] == "fancy" and fancy.received[0]["body"]["pad"] == "okok"


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in lead.a %}{% for j in lead.a %}{{ j }}{% endfor %}{% endfor %}",
        "{% set a = lead.email %}{{ a ~ a }}",
        "{% macro m() %}x{% endmacro %}{{ m() }}",
        "{{ 'x' * 1000000000000 }}",  # Jinja would fold this constant while compiling
        "{{ 9 ** 999999 }}",
        "{{ '%999999999s' % lead.email }}",
        "{{ lead.email|center(1000000000) }}",
        "{{ lead.email|striptags }}",
    ],
)
def test_field_templates_that_could_explode_are_refused_at_put(api, buyer_server, template):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/boom",
        headers=api.admin,
        json={
            "name": "Boom",
            "endpoint_url": buyer_server.url("boom"),
            "priority": 1,
            "price": "1.00",
            "timezone": "UTC",
            "delivery": {"fields": {"x": template}},
        },
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_buyer"


@pytest.mark.parametrize(
    "lead",
    [
        {"s": "y" * 1000, "n": "100000"},  # replace with an empty needle: len(s) insertions of s
    ],
)
def test_a_lead_that_blows_a_filter_up_is_not_sent(api, buyer_server, lead):
    fancy = buyer_server.add("fancy")
    key = api.put_publisher("surge")
    api.put_buyer("fancy", buyer_server.url("fancy"), delivery={"fields": {"x": "{{ lead.s|replace('', lead.s) }}"}})
    api.settle_config()
    body = api.post_lead(key, lead).json()
    assert body["status"] == "unsold" and not fancy.received


def test_x_request_id_is_taken_only_when_it_is_an_id(api):
    hostile = ["<img src=x onerror=alert(1)>", "a" * 65, "a b", "id;drop", "\u00e9t\u00e9"]
    for rid in hostile:
        got = api.http.get(api.base + "/healthz", headers={"X-Request-Id": rid}).headers["X-Request-Id"]
        assert got != rid and len(got) == 32 and all(c in "0123456789abcdef" for c in got)
    assert (
        api.http.get(api.base + "/healthz", headers={"X-Request-Id": "req-1.A_b"}).headers["X-Request-Id"]
        == "req-1.A_b"
    )


def test_a_hostile_request_id_never_reaches_a_job(api, buyer_server, queue_server, worker_manager):
    worker_manager.stop()  # the run's RQ worker, if an earlier test started it, would take the job first
    buyer_server.add("acme")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    resp = api.http.post(
        f"{api.base}/v1/leads",
        json={"lead_id": "x1"},
        headers={"Authorization": f"Bearer {key}", "X-Request-Id": "<script>alert(1)</script>"},
    )
    assert resp.status_code == 200
    from rq import Queue

    from webhooks.formats.validate import is_id

    assert resp.headers["X-Request-Id"] != "<script>alert(1)</script>"
    jobs = Queue("floodgate", connection=Redis.from_url(queue_server.url)).jobs
    # a sweep's job (the scheduler's, between requests) carries no request id at all
    request_ids = [job.meta["request_id"] for job in jobs if job.meta.get("request_id") is not None]
    assert request_ids and all(is_id(rid) for rid in request_ids)
    assert not any("<" in json.dumps(job.meta) + (job.description or "") for job in jobs)


def test_buyer_replies_are_read_up_to_a_limit(api, buyer_server):
    from tests.leads.posting.test_integration import _reply

    huge, fine = buyer_server.add("huge"), buyer_server.add("fine")
    _reply(huge, {"accepted": True, "pad": "x" * (1024 * 1024)})
    _reply(fine, {"accepted": True, "pad": "x" * (60 * 1024)})
    key = api.put_publisher("surge")
    api.put_buyer("huge", buyer_server.url("huge"), priority=1)
    api.put_buyer("fine", buyer_server.url("fine"), priority=2)
    api.settle_config()
    for i in range(2):  # the connection the long reply was on is not reused half-read
        body = api.post_lead(key, {"lead_id": f"r{i}"}).json()
        assert [(a["buyer_id"], a["outcome"]) for a in body["attempts"]] == [("huge", "error"), ("fine", "accepted")]


def test_a_bid_above_the_ceiling_is_no_bid(api, buyer_server):
    from tests.leads.path.test_routing import PING, _bidder

    greedy, _ = _bidder(buyer_server, "greedy", "5000.00")  # PING_MAX_BID defaults to 1000.00
    fair, _ = _bidder(buyer_server, "fair", "999.99")
    key = api.put_publisher("surge", routing="price")
    api.put_buyer(
        "greedy", buyer_server.url("greedy"), price="1.00", ping={**PING, "url": buyer_server.url("greedy/ping")}
    )
    api.put_buyer("fair", buyer_server.url("fair"), price="1.00", ping={**PING, "url": buyer_server.url("fair/ping")})
    api.settle_config()
    body = api.post_lead(key, {"lead_id": "bid-1"}).json()
    assert body["buyer_id"] == "fair" and body["price"] == "999.99" and not greedy.received


def test_ops_pages_carry_a_restrictive_content_security_policy(api):
    page = api.get("/ops")
    assert page.status_code == 200
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'none'" in policy and "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    dash = api.get("/ops/rq/")
    nonce = dash.headers["Content-Security-Policy"].split("'nonce-")[1].split("'")[0]
    assert f'<script type="text/javascript" nonce="{nonce}">' in dash.text
    assert "'unsafe-inline'" not in dash.headers["Content-Security-Policy"].split("script-src")[1].split(";")[0]
    assert "Content-Security-Policy" in api.get("/ops/rq/0/data/queues.json").headers
    assert "Content-Security-Policy" not in api.http.get(api.base + "/healthz").headers


def test_logout_ends_the_session_in_redis(api, redis_server):
    http = api.session()
    session_id = ops.login(http, api.base, ADMIN_TOKEN)
    csrf = ops.form_token(http, api.base)
    key = keys.ops_session(hashlib.sha256(session_id.encode()).hexdigest())
    cookies = {"floodgate_ops": session_id}
    assert api.http.get(api.base + "/ops", cookies=cookies).status_code == 200
    cross = api.http.post(
        api.base + "/ops/logout",
        data={"csrf_token": csrf},
        cookies=cookies,
        headers={"Sec-Fetch-Site": "cross-site"},
        allow_redirects=False,
    )
    assert cross.status_code == 403 and redis_server.client().exists(key)
    forged = api.http.post(
        api.base + "/ops/logout", cookies=cookies, headers={"Sec-Fetch-Site": "same-origin"}, allow_redirects=False
    )
    assert forged.status_code == 403 and redis_server.client().exists(key)  # no form token
    out = api.http.post(
        api.base + "/ops/logout",
        data={"csrf_token": csrf},
        cookies=cookies,
        headers={"Sec-Fetch-Site": "same-origin"},
        allow_redirects=False,
    )
    assert out.status_code == 303 and not redis_server.client().exists(key)
    assert 'floodgate_ops=""' in out.headers["Set-Cookie"] or "Max-Age=0" in out.headers["Set-Cookie"]
    gone = api.http.get(api.base + "/ops", cookies=cookies, allow_redirects=False)
    assert gone.status_code == 303  # a kept copy is worthless: back to the login form


def test_buyer_credential_headers_never_reach_the_audit_log_in_clear(api, buyer_server):
    secret = "sk_acme_secret_7f3a9c"
    api.put_buyer("acme", buyer_server.url("acme"), delivery={"headers": {"X-Api-Key": secret}})
    api.put_buyer("acme", buyer_server.url("acme"), delivery={"headers": {"X-Api-Key": "****" + secret[-4:]}})
    with db.connection_context():
        details = [row.detail for row in AuditLog.select().where(AuditLog.entity_id == "acme")]
    assert len(details) == 2 and all(secret not in (d or "") for d in details)
    assert all("****" + secret[-4:] in d for d in details)


def test_secrets_in_url_queries_are_redacted_in_logs_and_stored_errors(caplog):
    from webhooks.events.sender import Sender
    from webhooks.logs import JsonFormatter, redact_text

    line = JsonFormatter().format(
        logging.makeLogRecord(
            {
                "msg": "post to %s failed",
                "args": ("https://u:pw@buyer.example/in?api_key=KEYSECRET1&x=1&token=TOKSECRET2",),
            }
        )
    )
    assert "KEYSECRET1" not in line and "TOKSECRET2" not in line and "pw@" not in line and "x=1" in line
    assert (
        redact_text("http://h/p?signature=abc;code=zz&ok=1") == "http://h/p?signature=<redacted>;code=<redacted>&ok=1"
    )
    sender = Sender("http://127.0.0.1:9/hook?token=SECRET123", ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",), 1.0)
    error = sender.send("evt_1", "{}").error
    assert error and "SECRET123" not in error and "token=<redacted>" in error


def test_the_journal_keeps_what_it_needs_within_its_byte_budget(database_url, queue_server):
    """2,000 large emoji-heavy unsold leads: the journal stays under its budget; after a
    Redis data loss the newest are pushed again whole, the oldest without their bodies."""
    from webhooks.leads.path import settlement
    from webhooks.leads.path.routing import Outcome
    from webhooks.leads.rules.publishers import PublisherRule
    from webhooks.storage.live.settle_queue import queue

    # A database index of its own: no worker drains this queue behind the test's back
    r = Redis(port=queue_server.port, db=7, decode_responses=True)
    r.flushdb()
    budget = 4 * 1024 * 1024
    journal = settlement.Journal(r, queue(Redis(port=queue_server.port, db=7)), 600, max_bytes=budget)
    journal._watcher = threading.current_thread()  # this test calls check_epoch itself
    pub = PublisherRule(id="surge", active=True, payout_pct=Decimal("10"))
    payloads = []
    for i in range(2000):  # random, so that compression cannot hide their size
        rng = random.Random(i)
        note = "".join(chr(0x1F600 + rng.randrange(80)) for _ in range(4000)) + rng.randbytes(8000).hex()
        payloads.append(json.dumps({"note": note}, ensure_ascii=False))
        journal.push(
            settlement.make_item(
                publisher=pub,
                lead_id=f"e{i}",
                outcome=Outcome(),
                payload=payloads[-1],
                received_at=datetime.now(timezone.utc),
                request_id=None,
            )
        )
        if i % 200 == 199:
            r.delete(keys.SETTLE_PENDING)  # the worker drains as it goes
    assert journal.bytes <= budget and len(journal.entries) == 2000
    journal.check_epoch()
    r.flushdb()  # the settlement Redis restarts empty
    assert journal.check_epoch() == 2000
    pushed = {item["lead_id"]: item for item in map(json.loads, r.lrange(keys.SETTLE_PENDING, 0, -1))}
    assert pushed["e1999"]["payload"] == payloads[1999] and "payload_dropped" not in pushed["e1999"]
    assert pushed["e0"]["payload"] == "" and pushed["e0"]["payload_dropped"] is True
    with db.connection_context():
        assert Lead.select().count() == 0  # (nothing settled here: the test reads the queue only)


def test_under_gunicorn_bad_ids_and_unbuildable_posts_leave_every_breaker_closed(web_api, buyer_server, redis_server):
    """The attack as it was run: leads whose id ends in a newline (which http.client refused to
    put into the buyer's Idempotency-Key, counted as the buyer's failure) and leads its template
    cannot render within budget, against two gevent workers: no breaker moves, and another
    publisher's lead is still sold to the first buyer."""
    api = web_api
    fancy, plain = buyer_server.add("fancy"), buyer_server.add("plain")
    attacker, honest = api.put_publisher("attacker"), api.put_publisher("honest")
    api.put_buyer("fancy", buyer_server.url("fancy"), priority=1, delivery=EXPLODING)
    api.put_buyer("plain", buyer_server.url("plain"), priority=2)
    api.settle_config()
    for i in range(8):
        assert api.post_lead(attacker, {"lead_id": f"nl{i}\n"}).status_code == 400
        body = api.post_lead(attacker, {"lead_id": f"big{i}", "n": "100000", "pad": "p" * 200}).json()
        assert body["buyer_id"] == "plain", body
    assert _breaker(redis_server, "fancy") == {} and _breaker(redis_server, "plain") == {}
    assert not fancy.received and len(plain.received) == 8
    body = api.post_lead(honest, {"lead_id": "h1", "n": "1", "pad": "ok"}).json()
    assert body["status"] == "sold" and body["buyer_id"] == "fancy"
