"""Health, readiness, gevent concurrency and config propagation across real processes."""

from __future__ import annotations

import threading

import pytest
import requests

from testkit.servers import WebServer, free_port, wait_until
from tests.conftest import ADMIN_TOKEN

pytestmark = pytest.mark.e2e  # gunicorn processes of its own


def test_healthz_and_readyz(api):
    assert api.http.get(api.base + "/healthz").status_code == 200
    resp = api.http.get(api.base + "/readyz")
    assert resp.status_code == 200 and resp.json()["status"] == "ready"
    # the providers whose webhooks are configured but whose payments are not reconciled, and why
    # (the tests' stack sets every webhook secret and no provider API key but Paystack's)
    not_reconciled = resp.json()["not_reconciled"]
    assert "paystack" not in not_reconciled
    assert not_reconciled["stripe"] == "STRIPE_API_KEY unset"
    assert "no list API" in not_reconciled["interswitch"]


def test_readyz_names_what_is_down(base_env, tmp_path):
    env = {
        **base_env,
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "DATABASE_URL": f"mysql://root@127.0.0.1:{free_port()}/nothing",
    }
    server = WebServer(env, tmp_path / "web.log", workers=1)
    try:
        resp = requests.get(server.url + "/readyz", timeout=10)
        assert resp.status_code == 503
        assert resp.json()["down"] == ["redis", "database"]
        assert resp.json()["error"]["code"] == "unavailable"
        # The lead path refuses to sell while Redis is down.
        lead = requests.post(
            server.url + "/v1/leads",
            json={"state": "TX"},
            headers={"Authorization": "Bearer pk_whatever_0123456789"},
            timeout=10,
        )
        assert lead.status_code == 503 and lead.json()["error"]["code"] == "unavailable"
    finally:
        server.stop()


def test_one_web_process_serves_a_fast_request_while_a_slow_one_waits(base_env, tmp_path, buyer_server):
    """gevent is patched: a lead stuck on a slow buyer does not block /healthz in the same
    (single) worker process."""
    server = WebServer(base_env, tmp_path / "web.log", workers=1)
    try:
        from tests.conftest import Api

        api = Api(server.url)
        slow = buyer_server.add("slow", mode="sleep", delay=1.2)
        key = api.put_publisher("pub")
        api.put_buyer("slow", buyer_server.url("slow"))
        api.settle_config()
        slow_result = {}
        t = threading.Thread(target=lambda: slow_result.update(r=api.post_lead(key, {"lead_id": "s1"})))
        t.start()
        wait_until(lambda: slow.arrived, what="the slow lead to wait on the buyer")
        fast = requests.get(server.url + "/healthz", timeout=5)
        slow_still_running = t.is_alive()
        t.join()
        assert fast.status_code == 200
        assert slow_still_running, "the fast request should finish while the slow one is in flight"
        assert slow_result["r"].json()["status"] == "sold"
    finally:
        server.stop()


def test_buyer_change_reaches_two_separate_web_processes(base_env, tmp_path, buyer_server):
    """Each process checks the config version every CONFIG_CHECK_INTERVAL_MS (500 ms): a
    change reaches both, waited for by posting leads (not for a second: a busy machine)."""
    env = {**base_env, "CONFIG_CHECK_INTERVAL_MS": "500"}  # the production default
    a = WebServer(env, tmp_path / "a.log", workers=1)
    b = WebServer(env, tmp_path / "b.log", workers=1)
    try:
        from tests.conftest import Api

        api_a, api_b = Api(a.url), Api(b.url)
        buyer_server.add("acme")
        key = api_a.put_publisher("pub")
        leads = iter(range(10**6))

        def answers(api, field: str, value: str) -> bool:
            return api.post_lead(key, {"lead_id": f"l{next(leads)}"}).json().get(field) == value

        api_a.put_buyer("acme", buyer_server.url("acme"), price="5.00")
        for api in (api_a, api_b):
            wait_until(lambda api=api: answers(api, "price", "5.00"), what="the buyer in each process")
        api_a.put_buyer("acme", buyer_server.url("acme"), price="7.25")
        for api in (api_a, api_b):
            wait_until(lambda api=api: answers(api, "price", "7.25"), what="the new price in each process")
        requests.delete(f"{a.url}/v1/admin/buyers/acme", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        wait_until(lambda: answers(api_b, "status", "unsold"), what="the deletion in the other process")
    finally:
        a.stop()
        b.stop()
