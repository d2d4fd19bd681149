"""The console's other forms, each checked against what the admin API then answers:
publishers (a key made and shown once, kept by the edit form, replaced by the button), a
lead's trace and its return, an unattributed payment's assign (exactly once), failed event
deliveries retried and an endpoint replayed, the report and the audit log."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from testkit.events import EVENTS_SECRET, EventReceiver, deliver_inline
from testkit.payments import deliver, encode, payload, without_payer
from tests.web.ops.conftest import post
from webhooks.events import log as events_log
from webhooks.events import sender


def page(api, browser, path):
    resp = browser[0].get(api.base + path)
    assert resp.status_code == 200, resp.text[:300]
    return resp.text


def shown_key(text: str) -> str:
    found = re.search(r'<code class="secret">([^<]+)</code>', text)
    assert found, "no key shown"
    return found.group(1)


def test_a_publisher_made_from_the_form_gets_a_key_shown_once_that_posts_leads(api, browser, buyer_server):
    resp = post(
        api,
        browser,
        "/ops/publishers",
        {"id": "pub-a", "name": "Pub A", "payout.type": "fixed", "payout.amount": "2.50"},
    )
    assert resp.status_code == 201
    key = shown_key(resp.text)
    assert key.startswith("pk_") and len(key) >= 40
    got = api.get("/v1/admin/publishers/pub-a").json()
    assert got["payout"] == {"type": "fixed", "amount": "2.50"} and got["api_key_hint"] == "…" + key[-4:]
    assert key not in page(api, browser, "/ops/publishers/pub-a")  # shown that once only
    buyer_server.add("buyer-a")
    api.put_buyer("buyer-a", buyer_server.url("buyer-a"), price="10.00")
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "l-1"}).json()["status"] == "sold"

    # the edit form with its key field left empty keeps the key; a percent payout replaces the fixed one
    edit = {
        "name": "Pub A2",
        "api_key": "",
        "payout.type": "percent",
        "payout.pct": "15",
        "payout.amount": "",
        "active": "",
        "routing": "waterfall",
        "mode": "live",
    }
    resp = post(api, browser, "/ops/publishers/pub-a", [*edit.items(), ("active", "on")])
    assert resp.status_code == 303, resp.text[:500]
    got = api.get("/v1/admin/publishers/pub-a").json()
    assert got["name"] == "Pub A2" and got["payout"] == {"type": "percent", "pct": "15.00"} and got["active"] is True
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "l-2"}).status_code == 200

    # a new key: shown once, the old one refused from now on
    resp = post(api, browser, "/ops/publishers/pub-a/key", {})
    new_key = shown_key(resp.text)
    assert resp.status_code == 200 and new_key != key
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "l-3"}).status_code == 401
    assert api.post_lead(new_key, {"lead_id": "l-3"}).status_code == 200

    assert post(api, browser, "/ops/publishers/pub-a/pause", {}).status_code == 303
    assert api.get("/v1/admin/publishers/pub-a").json()["active"] is False
    assert post(api, browser, "/ops/publishers/pub-a/resume", {}).status_code == 303
    assert api.get("/v1/admin/publishers/pub-a").json()["active"] is True
    text = page(api, browser, "/ops/publishers/pub-a")
    assert key not in text and new_key not in text
    assert "publisher.put" in text  # the audit rows, on its page


def test_a_publisher_form_refusal_is_shown_beside_its_field(api, browser):
    resp = post(api, browser, "/ops/publishers", {"id": "pub-b", "name": "B", "api_key": "short"})
    assert resp.status_code == 400 and re.search(r'data-error-for="api_key">', resp.text)
    assert 'value="short"' not in resp.text  # a secret is not written back into the page
    assert api.get("/v1/admin/publishers/pub-b").status_code == 404


def test_a_lead_found_by_the_search_is_returned_from_its_trace(api, browser, buyer_server, worker):
    buyer_server.add("ret")
    key = api.put_publisher("pub-r")
    api.put_buyer("ret", buyer_server.url("ret"), price="8.00")
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "r-1"}).json()["status"] == "sold"
    api.wait_settled("r-1", "pub-r")
    listing = page(api, browser, "/ops/leads?buyer_id=ret&status=sold")
    assert 'data-lead="r-1"' in listing and "/ops/leads/r-1?publisher_id=pub-r" in listing
    assert 'data-lead="r-1"' not in page(api, browser, "/ops/leads?buyer_id=ret&status=unsold")
    trace = page(api, browser, "/ops/leads/r-1?publisher_id=pub-r")
    assert 'data-attempt="ret"' in trace and 'id="return-form"' in trace
    resp = post(api, browser, "/ops/leads/r-1/return", {"publisher_id": "pub-r", "reason": "wrong number"})
    assert resp.status_code == 303 and "notice=returned" in resp.headers["Location"]
    got = api.get("/v1/admin/leads/r-1").json()
    assert got["status"] == "returned" and got["return_reason"] == "wrong number"
    trace = page(api, browser, resp.headers["Location"])
    assert 'data-status="returned"' in trace and 'id="return-form"' not in trace and "lead.returned" in trace
    again = post(api, browser, "/ops/leads/r-1/return", {"publisher_id": "pub-r"})
    assert again.status_code == 409 and "returned already" in again.text  # shown on the trace, not a JSON error


def test_a_bad_search_filter_is_shown_on_the_page(api, browser):
    resp = browser[0].get(api.base + "/ops/leads?since=yesterday")
    assert resp.status_code == 400 and "since: must be an ISO 8601 instant" in resp.text


def test_an_unattributed_payment_is_assigned_once_from_its_row(api, browser):
    raw = encode(without_payer("standard", payload("standard", "std-ops-1", 5000)))
    assert deliver(api, "standard", raw).json() == {"status": "unattributed"}
    text = page(api, browser, "/ops/payments")
    assert 'data-payment="standard:std-ops-1"' in text and "/ops/payments/standard/std-ops-1/assign" in text
    resp = post(api, browser, "/ops/payments/standard/std-ops-1/assign", {"customer": "   "})
    assert resp.status_code == 400 and 'data-error-for="standard:std-ops-1"' in resp.text
    resp = post(api, browser, "/ops/payments/standard/std-ops-1/assign", {"customer": "Ada@Example.com"})
    assert resp.status_code == 303 and "notice=assigned" in resp.headers["Location"]
    assert api.get("/v1/admin/payments/standard/std-ops-1").json()["status"] == "credited"
    assert api.get("/v1/admin/wallets/ada@example.com").json()["balances_minor"]
    text = page(api, browser, resp.headers["Location"])
    assert 'data-payment="standard:std-ops-1"' not in text and "Assigned" in text and "payment.assign" in text
    again = post(api, browser, "/ops/payments/standard/std-ops-1/assign", {"customer": "someone@example.com"})
    assert again.status_code == 409 and "not unattributed" in again.text
    assert api.get("/v1/admin/payments/standard/std-ops-1").json()["customer"] == "ada@example.com"


@pytest.fixture
def receiver():
    server = EventReceiver()
    yield server
    server.close()


def test_failed_deliveries_are_retried_and_an_endpoint_replayed_from_the_events_page(
    api, browser, reconfigure, receiver, engine_lock
):
    reconfigure(payment_events_url=receiver.url, payment_events_secrets=(EVENTS_SECRET,))
    assert deliver(api, "standard", encode(payload("standard", "std-ev-1", 700))).json()["status"] == "credited"
    receiver.fail = lambda body: True
    give_up = sender.RetryPolicy(base_ms=20, max_ms=200, retry_for_s=0)
    deliver_inline(receiver.url, give_up, until=lambda: events_log.payment_event_counts()["failed"] == 1)
    text = page(api, browser, "/ops/events")
    assert 'data-failed="1"' in text and "Retry failed deliveries" in text
    receiver.fail = None
    resp = post(api, browser, "/ops/events/retry", {})
    assert resp.status_code == 303 and "notice=retried" in resp.headers["Location"]
    assert events_log.payment_event_counts()["failed"] == 0
    deliver_inline(receiver.url)
    assert len(receiver.accepted()) == 1 and "events.retry" in page(api, browser, "/ops/events")

    endpoint = re.search(r'action="/ops/events/([^/"]+)/replay"', text).group(1)
    resp = post(api, browser, f"/ops/events/{endpoint}/replay", {"since": "last week"})
    assert resp.status_code == 400 and f'data-error-for="{endpoint}"' in resp.text
    since = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    resp = post(api, browser, f"/ops/events/{endpoint}/replay", {"since": since})
    assert resp.status_code == 303 and "notice=replaying" in resp.headers["Location"]
    deliver_inline(receiver.url, until=lambda: len(receiver.accepted()) == 2)
    first, again = receiver.accepted()
    assert first.event_id == again.event_id  # the same event, sent again with its webhook-id


def test_the_report_and_the_audit_log(api, browser, buyer_server, worker):
    buyer_server.add("rep")
    key = api.put_publisher("pub-rep")
    api.put_buyer("rep", buyer_server.url("rep"), price="5.00")
    api.settle_config()
    api.post_lead(key, {"lead_id": "rep-1"})
    api.wait_settled("rep-1", "pub-rep")
    text = page(api, browser, "/ops/reports?group_by=buyer")
    assert re.search(r'<tr data-key="rep">.*?<td class="num">1</td>', text, re.S)
    assert browser[0].get(api.base + "/ops/reports?from=2026-13-01").status_code == 400
    csv = browser[0].get(api.base + "/ops/reports/leads.csv?group_by=buyer")
    assert csv.status_code == 200 and csv.text.splitlines()[0].startswith("key,leads")
    audit = page(api, browser, "/ops/audit")
    assert 'data-action="buyer.create"' in audit and 'data-action="publisher.put"' in audit
    only = page(api, browser, "/ops/audit?entity=buyer")
    assert 'data-action="publisher.put"' not in only


def test_suppression_lists_and_consent_are_set_from_the_forms(api, browser, buyer_server):
    resp = api.http.put(
        f"{api.base}/v1/admin/suppression-lists/dnc", json={"field": "email", "hash": "md5"}, headers=api.admin
    )
    assert resp.status_code == 200
    buyer = {"id": "careful", "name": "Careful", "endpoint_url": buyer_server.url("careful"), "price": "9.00"}
    fields = [*buyer.items(), ("suppress", "dnc"), ("require_consent", "trustedform"), ("require_consent", "jornaya")]
    assert post(api, browser, "/ops/buyers", fields).status_code == 303
    shown = api.get("/v1/admin/buyers/careful").json()
    assert (shown["suppress"], shown["require_consent"]) == (["dnc"], ["jornaya", "trustedform"])
    refused = post(api, browser, "/ops/buyers", {**buyer, "id": "other", "require_consent": "a notary"})
    assert refused.status_code == 400 and re.search(r'data-error-for="require_consent">', refused.text)
    made = post(api, browser, "/ops/publishers", {"id": "pub-s", "name": "S", "suppress": "dnc"})
    assert made.status_code == 201
    assert api.get("/v1/admin/publishers/pub-s").json()["suppress"] == ["dnc"]


def test_the_pre_ping_quota_is_set_from_the_form_and_its_use_shown(api, browser):
    key = api.put_publisher("pub-q")
    bad = post(api, browser, "/ops/publishers/pub-q", {"name": "Q", "precheck.per_lead": "many"})
    assert bad.status_code == 400 and re.search(r'data-error-for="precheck.per_lead">[^<]*integer', bad.text)
    fields = {"name": "Q", "precheck.per_lead": "2", "precheck.daily_floor": "3"}
    assert post(api, browser, "/ops/publishers/pub-q", fields).status_code == 303
    assert api.get("/v1/admin/publishers/pub-q").json()["precheck"] == {"per_lead": 2, "daily_floor": 3}
    api.settle_config()
    resp = api.http.post(f"{api.base}/v1/leads/check", json={}, headers={"Authorization": f"Bearer {key}"})
    assert resp.status_code == 200
    text = page(api, browser, "/ops/publishers/pub-q")
    assert re.search(r'data-cap="precheck".*?<span class="num">1 / 3</span>', text, re.S)
    cleared = {"name": "Q", "precheck.per_lead": "", "precheck.daily_floor": ""}  # empty: the defaults
    assert post(api, browser, "/ops/publishers/pub-q", cleared).status_code == 303
    assert api.get("/v1/admin/publishers/pub-q").json()["precheck"] == {"per_lead": 10, "daily_floor": 1000}
