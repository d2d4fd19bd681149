"""Redis down and Redis data loss: fail closed, rebuild from the ledger, resume by itself.

The web server lives for the whole run and its settlement journal outlives a test, so each
test here uses buyer ids of its own."""
from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.servers import wait_until

pytestmark = pytest.mark.e2e  # kills and restarts the run's redis-server


def test_redis_down_answers_503_and_sells_nothing(api, buyer_server, redis_server):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    redis_server.kill()
    try:
        resp = api.post_lead(key, {"lead_id": "down-1"})
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "unavailable"
        assert acme.received == []
        assert api.http.get(api.base + "/readyz").json()["down"] == ["redis"]
    finally:
        redis_server.start()


def test_after_data_loss_counters_are_rebuilt_from_the_ledger_before_selling(
        api, buyer_server, redis_server, worker):
    lossy = buyer_server.add("lossy")
    key = api.put_publisher("pub-lossy")
    api.put_buyer("lossy", buyer_server.url("lossy"), caps={"daily": 5, "hourly": 4})
    api.settle_config()
    for i in range(3):
        assert api.post_lead(key, {"lead_id": f"pre-{i}"}).json()["status"] == "sold"
    for i in range(3):
        api.wait_settled(f"pre-{i}", "pub-lossy")
    redis_server.restart_empty()  # every key is gone, the ledger is not
    first = api.post_lead(key, {"lead_id": "post-0"})
    assert first.status_code == 503  # fail closed while the counters are rebuilt
    assert len(lossy.received) == 3

    def sells():
        resp = api.post_lead(key, {"lead_id": "post-0"})
        return resp.status_code == 200 and resp.json()["status"] == "sold"

    wait_until(sells, timeout=20, interval=0.3, what="selling to resume after the rebuild")
    usage = api.get("/v1/admin/buyers/lossy").json()["usage"]
    assert usage["daily"]["used"] == 4 and usage["hourly"]["used"] == 4
    # the hourly cap (4) binds: 3 sold before the loss + 1 after
    assert api.post_lead(key, {"lead_id": "post-1"}).json()["status"] == "unsold"
    assert lossy.accepted == 4


def test_redis_restarted_empty_mid_burst_never_exceeds_the_cap(api, buyer_server, redis_server, worker):
    """The chaos burst (cap 100, 1,000 leads, 50 threads) with Redis emptied part-way through."""
    burst = buyer_server.add("burst", delay=0.005)
    key = api.put_publisher("pub-burst")
    api.put_buyer("burst", buyer_server.url("burst"), caps={"daily": 100})
    api.settle_config()
    statuses = Counter()

    def one(i):
        if i == 60:
            redis_server.restart_empty()
        try:
            resp = api.session().post(f"{api.base}/v1/leads", json={"lead_id": f"burst-{i}"},
                                 headers={"Authorization": f"Bearer {key}"}, timeout=30)
        except requests.RequestException:
            return "error"
        return resp.json().get("status") or resp.json()["error"]["code"]

    with ThreadPoolExecutor(50) as pool:
        statuses.update(pool.map(one, range(1000)))
    assert burst.accepted <= 100
    assert statuses["sold"] == burst.accepted
    # after the rebuild, selling resumes until the cap is reached
    wait_until(lambda: api.post_lead(key, {"lead_id": f"after-{burst.accepted}"}).status_code == 200,
               timeout=20, interval=0.3, what="routing to resume")
    for i in range(150):
        if api.post_lead(key, {"lead_id": f"fill-{i}"}).json()["status"] == "unsold":
            break
    assert burst.accepted == 100
