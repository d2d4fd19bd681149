"""Payment events to the application (docs/api.md "Payment events to your application"): one event per
wallet change, written with it; delivered signed per Standard Webhooks to a real local receiver
that verifies them with the standardwebhooks library; retried with back-off under a stable
`webhook-id`; one customer's events in order; `failed` after the retry window, visible and
requeued. The sending batches run in this process; tests/e2e/test_payment_lifecycle.py runs
the real worker."""

from __future__ import annotations

import json
import subprocess

import pytest
import redis
from rq import Queue

from testkit.events import EVENTS_SECRET, EventReceiver, deliver_inline, event_rows
from testkit.payments import deliver, encode, payload, refund_payload
from testkit.servers import ROOT, venv_bin
from tests.conftest import ADMIN_TOKEN
from webhooks import config
from webhooks.errors import ConfigError
from webhooks.events import log as events_log
from webhooks.events import sender
from webhooks.storage.live import keys, outbox_queue

# docs/api.md: the body is {"type", "data": {these}}
CONTRACT_FIELDS = ["provider", "reference", "customer", "currency", "amount_minor", "balance_minor"]


@pytest.fixture
def receiver():
    server = EventReceiver()
    yield server
    server.close()


@pytest.fixture
def events_on(reconfigure, receiver, engine_lock):
    """The in-process app with PAYMENT_EVENTS_URL pointing at the receiver; the events engine
    runs here only."""
    reconfigure(payment_events_url=receiver.url, payment_events_secrets=(EVENTS_SECRET,))
    return receiver


def credit(api, provider: str, reference: str, amount: int, email: str = "ada@example.com", currency: str = "NGN"):
    resp = deliver(api, provider, encode(payload(provider, reference, amount, currency, email)))
    assert resp.status_code == 200, resp.text
    return resp.json()["status"]


def debit(
    api, provider: str, reference: str, paid: str, amount: int, email: str = "ada@example.com", currency: str = "NGN"
):
    resp = deliver(api, provider, encode(refund_payload(provider, reference, paid, amount, currency, email)))
    return resp.json().get("status") or resp.json()["error"]["code"]


def test_each_credit_and_debit_writes_one_event_with_it_and_nothing_else_does(api, events_on):
    assert credit(api, "paystack", "ps-ev", 10_000) == "credited"
    assert credit(api, "paystack", "ps-ev", 10_000) == "duplicate"
    assert debit(api, "paystack", "rf-ev", "ps-ev", 4_000) == "debited"
    assert debit(api, "paystack", "rf-ev", "ps-ev", 4_000) == "duplicate"
    assert debit(api, "paystack", "rf-ev-big", "ps-ev", 7_000) == "refund_exceeds_payment"
    assert debit(api, "paystack", "rf-ev-early", "ps-none", 1_000) == "payment_not_found"
    conflict = deliver(api, "paystack", encode(payload("paystack", "ps-ev", 99, "NGN")))
    assert conflict.status_code == 422
    rows = event_rows()
    ada = {"provider": "paystack", "customer": "ada@example.com", "currency": "NGN"}
    assert [r["body"] for r in rows] == [
        {
            "type": "wallet.credited",
            "data": {**ada, "reference": "ps-ev", "amount_minor": 10_000, "balance_minor": 10_000},
        },
        {
            "type": "wallet.debited",
            "data": {**ada, "reference": "rf-ev", "amount_minor": 4_000, "balance_minor": 6_000},
        },
    ]
    assert [list(r["body"]["data"]) for r in rows] == [CONTRACT_FIELDS] * 2
    assert all(r["status"] == "pending" and r["id"].startswith("msg_") for r in rows)


def test_without_payment_events_url_the_event_is_logged_and_sent_nowhere(api, receiver):
    assert credit(api, "standard", "std-quiet", 1_000) == "credited"
    assert [r["body"]["data"]["reference"] for r in event_rows()] == ["std-quiet"]
    assert api.get("/v1/admin/payment-events").json() == {"events": [], "counts": {"pending": 0, "failed": 0}}
    deliver_inline()  # fanned out to no endpoint
    assert receiver.arrivals == [] and events_log.backlog() == {}


def test_events_arrive_signed_per_standard_webhooks_each_with_its_own_stable_id(api, events_on):
    credit(api, "stripe", "pi_sig", 2_500, "jenny@example.com", "USD")
    debit(api, "stripe", "re_sig", "pi_sig", 500, "jenny@example.com", "USD")
    deliver_inline(events_on.url)
    got = events_on.accepted()
    rows = event_rows()
    assert [(a.event_id, a.body) for a in got] == [(r["id"], r["body"]) for r in rows]
    assert all(a.verified for a in events_on.arrivals)
    assert {r["status"] for r in rows} == {"delivered"}


def test_a_failed_attempt_is_retried_with_the_same_webhook_id_and_body(api, events_on):
    credit(api, "monnify", "MNFY|ev|retry", 3_000)
    events_on.fail_next = 2  # 500, 500, then 2xx
    deliver_inline(events_on.url)
    arrivals = events_on.arrivals
    assert len(arrivals) == 3 and [a.status for a in arrivals] == [500, 500, 204]
    assert len({a.event_id for a in arrivals}) == 1 and len({json.dumps(a.body) for a in arrivals}) == 1
    assert all(a.verified for a in arrivals)  # each attempt freshly signed (its own timestamp)
    [row] = event_rows()
    assert (row["status"], row["attempts"]) == ("delivered", 3)


def test_one_customers_events_wait_for_the_earlier_one_others_go_on(api, events_on):
    credit(api, "paystack", "ps-a1", 1_000, "a@example.com")
    credit(api, "paystack", "ps-a2", 2_000, "a@example.com")
    credit(api, "paystack", "ps-b1", 3_000, "b@example.com")
    debit(api, "paystack", "rf-a1", "ps-a1", 500, "a@example.com")
    blocked = {"on": True}
    events_on.fail = lambda body: blocked["on"] and body["data"]["reference"] == "ps-a1"
    deliver_inline(
        events_on.url,
        until=lambda: (
            "ps-b1" in refs(events_on) and sum(a.body["data"]["reference"] == "ps-a1" for a in events_on.arrivals) >= 3
        ),
    )
    assert refs(events_on) == ["ps-b1"]  # a's first keeps failing: a's later events wait behind it
    assert {a.body["data"]["reference"] for a in events_on.arrivals} == {"ps-a1", "ps-b1"}
    blocked["on"] = False
    deliver_inline(events_on.url)
    assert [r for r in refs(events_on) if r != "ps-b1"] == ["ps-a1", "ps-a2", "rf-a1"]


def test_a_refund_before_its_payment_is_announced_after_the_credit(api, events_on):
    raw = encode(refund_payload("standard", "rf-early", "std-early", 300, "NGN", "ada@example.com"))
    assert deliver(api, "standard", raw).status_code == 409
    assert event_rows() == []
    assert credit(api, "standard", "std-early", 1_000) == "credited"
    assert deliver(api, "standard", raw).json() == {"status": "debited"}
    deliver_inline(events_on.url)
    assert [(a.body["type"], a.body["data"]["balance_minor"]) for a in events_on.accepted()] == [
        ("wallet.credited", 1_000),
        ("wallet.debited", 700),
    ]


def refs(receiver: EventReceiver) -> list[str]:
    return [a.body["data"]["reference"] for a in receiver.accepted()]


def test_an_event_failing_past_the_retry_window_is_failed_shown_and_requeued_by_the_cli(api, events_on, base_env):
    credit(api, "standard", "std-fail", 7_700)
    events_on.fail = lambda body: True
    give_up_at_once = sender.RetryPolicy(base_ms=20, max_ms=200, retry_for_s=0)
    deliver_inline(events_on.url, give_up_at_once, until=lambda: events_log.payment_event_counts()["failed"] == 1)
    [row] = event_rows()

    listed = api.get("/v1/admin/payment-events", params={"status": "failed"})
    assert listed.status_code == 200
    assert [e["id"] for e in listed.json()["events"]] == [row["id"]]
    assert listed.json()["events"][0]["last_error"] == "HTTP 500"
    assert listed.json()["counts"] == {"pending": 0, "failed": 1}
    assert api.get("/v1/admin/payment-events", params={"status": "pending"}).json()["events"] == []
    assert 'floodgate_payment_events{status="failed"} 1.0' in api.get("/metrics").text
    page = api.http.get(f"{api.base}/ops", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert row["id"] in page.text and 'data-failed="1"' in page.text

    events_on.fail = None
    done = subprocess.run(
        [venv_bin("flask"), "--app", "wsgi", "events", "retry"],
        env=base_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "requeued 1 failed event deliveries" in done.stdout, done.stderr
    deliver_inline(events_on.url)
    assert events_on.accepted_ids() == {row["id"]}
    assert api.get("/v1/admin/payment-events").json() == {"events": [], "counts": {"pending": 0, "failed": 0}}


@pytest.mark.parametrize("query", [{"status": "delivered"}, {"status": " "}, {"limit": "0"}, {"limit": "x"}])
def test_payment_events_listing_refuses_what_it_does_not_know(api, query):
    resp = api.get("/v1/admin/payment-events", params=query)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_query"


def test_commits_start_one_drain_and_the_sweep_only_when_none_is_scheduled(redis_server):
    r = redis_server.client(db=9)
    r.flushdb()
    q = Queue(outbox_queue.EVENTS, connection=redis.Redis(port=redis_server.port, db=9))
    for _ in range(5):
        outbox_queue.signal(r, q)
    assert q.count == 1 and r.llen(keys.OUTBOX_WAKE) == 1
    assert not outbox_queue.ensure_drain(r, q)  # one is scheduled: the sweep adds none
    outbox_queue.stop_draining(r)  # it finished (or Redis lost the flag)
    assert outbox_queue.ensure_drain(r, q) and q.count == 2
    assert {j.func_name for j in q.jobs} == {"workers.outbox.drain"}
    r.flushdb()


def test_the_sweep_is_a_periodic_job():
    from workers.schedule import PERIODIC

    assert {
        "func": "workers.outbox.sweep",
        "interval": 10,
        "description": "send due events (safety net)",
    } in PERIODIC


@pytest.mark.parametrize(
    "env, names",
    [
        ({"PAYMENT_EVENTS_URL": "https://app.example.com/hooks"}, ("PAYMENT_EVENTS_SECRET",)),
        (
            {"PAYMENT_EVENTS_URL": "https://app.example.com/hooks", "PAYMENT_EVENTS_SECRET": "whsec_not*base64!"},
            ("PAYMENT_EVENTS_SECRET", "base64"),
        ),
        ({"PAYMENT_EVENTS_SECRET": "whsec_"}, ("PAYMENT_EVENTS_SECRET", "decodes to no bytes")),
        (
            {"PAYMENT_EVENTS_SECRET": f"{EVENTS_SECRET} {EVENTS_SECRET} {EVENTS_SECRET}"},
            ("PAYMENT_EVENTS_SECRET", "at most two"),
        ),
        (
            {"PAYMENT_EVENTS_URL": "ftp://app.example.com/", "PAYMENT_EVENTS_SECRET": EVENTS_SECRET},
            ("PAYMENT_EVENTS_URL",),
        ),
        (
            {"PAYMENT_EVENTS_RETRY_BASE_MS": "5000", "PAYMENT_EVENTS_RETRY_MAX_MS": "1000"},
            ("PAYMENT_EVENTS_RETRY_BASE_MS",),
        ),
    ],
)
def test_an_unusable_events_setting_stops_loading_with_a_clear_message(env, names):
    with pytest.raises(ConfigError) as refused:
        config.load(env)
    assert all(name in refused.value.message for name in names), refused.value.message
    assert "not*base64" not in refused.value.message
