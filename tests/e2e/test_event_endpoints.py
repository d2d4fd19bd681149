"""Event endpoints on the whole stack (API.md "Event endpoints"): gunicorn + gevent, the real RQ
worker and scheduler on a private Redis that is restarted empty, the database, real receivers
verifying every delivery with the standardwebhooks library. 1,000 sales to three endpoints;
a worker killed -9 while it fans out, then Redis lost: nothing missing, duplicates only under
the same webhook-id; an endpoint failing past EVENT_ENDPOINT_DISABLE_AFTER_S disabled by the
worker, its events kept."""

from __future__ import annotations

import signal
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from testkit.events import EventReceiver, sale_item
from testkit.servers import wait_until
from tests.conftest import Api
from tests.e2e.test_payment_lifecycle import running_stack
from webhooks.events import log as events_log
from webhooks.leads.accounting import ledger
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Event

pytestmark = pytest.mark.e2e  # processes of its own, killed -9, a Redis restarted empty

SECRETS = [
    "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
    "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=",
    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
]


@pytest.fixture
def stack(base_env, database_url, tmp_path):
    with running_stack(base_env, tmp_path, {"EVENT_ENDPOINT_DISABLE_AFTER_S": "2"}) as made:
        yield made


@pytest.fixture
def receivers():
    made = [EventReceiver(secret) for secret in SECRETS]
    yield made
    for r in made:
        r.close()


def put_endpoint(api: Api, endpoint_id: str, receiver: EventReceiver, secret: str, **fields) -> None:
    body = {"url": receiver.url, "secret": secret, **fields}
    resp = api.http.put(f"{api.base}/v1/admin/event-endpoints/{endpoint_id}", json=body, headers=api.admin)
    assert resp.status_code == 200, resp.text


def lead_ids(receiver: EventReceiver, kind: str = "lead.sold") -> dict[str, set[str]]:
    """Per lead, the webhook-ids under which the receiver accepted its `kind` event."""
    found: dict[str, set[str]] = defaultdict(set)
    for a in receiver.accepted():
        if a.body["type"] == kind:
            found[a.body["data"]["lead_id"]].add(a.event_id)
    return found


def test_a_thousand_sales_reach_three_endpoints_three_thousand_deliveries_none_missing(stack, receivers, buyer_server):
    api = Api(stack.web.url)
    buyer_server.add("acme")
    for n, (r, secret) in enumerate(zip(receivers, SECRETS, strict=True)):
        extra = {"publisher_id": "surge"} if n == 2 else {"types": ["lead.sold"]} if n == 1 else {}
        put_endpoint(api, f"app{n}", r, secret, **extra)
    key = api.put_publisher("surge", commission_pct="25")
    api.put_buyer("acme", buyer_server.url("acme"), priority=1, price="20.00")
    api.settle_config()
    stack.worker()
    local = threading.local()
    sessions: list[requests.Session] = []

    def post(n: int) -> int:
        if getattr(local, "s", None) is None:
            local.s = requests.Session()
            sessions.append(local.s)
        resp = api.post_lead(key, {"lead_id": f"k{n}", "state": "TX", "email": f"k{n}@example.com"}, local.s)
        assert resp.status_code == 200, resp.text
        return n if resp.json()["status"] == "sold" else -1

    with ThreadPoolExecutor(32) as pool:
        sold = {f"k{n}" for n in pool.map(post, range(1000)) if n >= 0}
    for s in sessions:  # closed: their idle keep-alive connections would hold gunicorn's stop
        s.close()
    assert len(sold) == 1000
    wait_until(lambda: all(len(r.accepted()) >= 1000 for r in receivers), timeout=180, what="3,000 deliveries")
    for r in receivers:
        got = lead_ids(r)
        assert set(got) == sold  # none missing, none extra
        assert all(len(ids) == 1 for ids in got.values())  # each event once per endpoint here
        assert all(a.verified for a in r.arrivals)
        assert all(
            a.body["data"]
            == {
                "lead_id": a.body["data"]["lead_id"],
                "publisher_id": "surge",
                "payout": "5.00",
                "buyer_id": "acme",
                "price": "20.00",
            }
            for a in r.accepted()
        )
    ids = [next(iter(lead_ids(r)["k7"])) for r in receivers]
    assert len(set(ids)) == 3  # a webhook-id per event and endpoint
    api.http.close()


def _sell_directly(n: int) -> None:
    """Sales as the settlement writes them, many at once (their lead.sold events with them)."""
    items = [sale_item("surge", f"f{i}", payout="1.00") for i in range(n)]
    with db.connection_context():
        for i in range(0, n, 500):
            ledger.settle(items[i : i + 500])


def test_a_worker_killed_mid_fan_out_and_an_empty_redis_lose_nothing(stack, receivers):
    api = Api(stack.web.url)
    for n, (r, secret) in enumerate(zip(receivers, SECRETS, strict=True)):
        put_endpoint(api, f"app{n}", r, secret)
    # enough endpoints that a fan-out transaction takes a while: the kill lands inside one
    for n in range(3, 30):
        put_endpoint(api, f"quiet{n}", receivers[0], SECRETS[0], enabled=False)
    receivers[0].hold()  # deliveries in flight when the worker dies
    _sell_directly(2000)
    worker = stack.worker()

    def fanning_out() -> bool:
        with db.connection_context():
            done = Event.select().where(Event.fanned_out == True).count()  # noqa: E712 - SQL
        return 0 < done < 2000

    wait_until(fanning_out, timeout=60, interval=0.02, what="a fan-out under way")
    worker.stop(sig=signal.SIGKILL)
    receivers[0].release()
    with db.connection_context():
        assert events_log.not_fanned_out() > 0

    stack.redis.restart_empty()  # no job, flag or lock refers to them any more
    stack.worker()
    stack.scheduler()  # its sweep finds the work in the database
    wait_until(lambda: all(len(lead_ids(r)) == 2000 for r in receivers), timeout=240, what="every sale after the kill")
    for r in receivers:
        got = lead_ids(r)
        assert set(got) == {f"f{i}" for i in range(2000)}
        assert all(len(ids) == 1 for ids in got.values())  # a duplicate, if any, under the same webhook-id
        assert all(a.verified for a in r.arrivals)

    def backlog() -> dict[str, dict[str, int]]:
        with db.connection_context():
            return events_log.backlog()

    # a chain's dispatches are written delivered once all its sends are back (events/sender.py
    # `write`): the last deliveries can arrive before their rows say so
    wait_until(
        lambda: not any(e.startswith("app") for e in backlog()), timeout=60, what="every delivery written as such"
    )
    assert all(c == {"pending": 2000, "failed": 0} for e, c in backlog().items() if e.startswith("quiet"))
    api.http.close()


def test_the_worker_disables_an_endpoint_failing_past_the_window_and_keeps_its_events(stack, receivers):
    api = Api(stack.web.url)
    failing, healthy = receivers[0], receivers[1]
    failing.fail = lambda body: True
    put_endpoint(api, "failing", failing, SECRETS[0])
    put_endpoint(api, "healthy", healthy, SECRETS[1])
    stack.worker()
    _sell_directly(5)

    def disabled() -> bool:
        return api.get("/v1/admin/event-endpoints/failing").json()["disabled_reason"] == "failing"

    wait_until(disabled, timeout=60, what="the failing endpoint disabled")  # EVENT_ENDPOINT_DISABLE_AFTER_S=2
    metrics = api.get("/metrics").text
    assert 'floodgate_event_endpoint_disabled{endpoint="failing",reason="failing"} 1.0' in metrics
    assert 'floodgate_event_attempts_total{endpoint="failing",outcome="disabled"} 1.0' in metrics
    wait_until(lambda: len(lead_ids(healthy)) == 5, timeout=30, what="the healthy endpoint's events")
    assert lead_ids(failing) == {}

    failing.fail = None
    resp = api.http.put(
        f"{api.base}/v1/admin/event-endpoints/failing", json={"url": failing.url, "enabled": True}, headers=api.admin
    )
    assert resp.status_code == 200 and resp.json()["enabled"]
    wait_until(lambda: len(lead_ids(failing)) == 5, timeout=30, what="the kept events after enabling")
    api.http.close()
