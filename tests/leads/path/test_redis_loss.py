"""Redis down and Redis data loss: fail closed, rebuild from the ledger, resume by itself.

The web server lives for the whole run and its settlement journal outlives a test, so each
test here uses buyer ids of its own."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from testkit.servers import wait_until
from webhooks import services

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


def test_after_data_loss_counters_are_rebuilt_from_the_ledger_before_selling(api, buyer_server, redis_server, worker):
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
    assert int(first.headers["Retry-After"]) >= 1  # the claim window's rest (docs/leads.md)
    assert len(lossy.received) == 3

    def sells():
        resp = api.post_lead(key, {"lead_id": "post-0"})
        return resp.status_code == 200 and resp.json()["status"] == "sold"

    # 503 while the counters are rebuilt and, for a lead the ledger has not seen, until one
    # claim's life after the loss (a request of before it may still be offering the lead)
    wait_until(sells, timeout=45, interval=0.3, what="selling to resume after the rebuild")
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
            resp = api.session().post(
                f"{api.base}/v1/leads",
                json={"lead_id": f"burst-{i}"},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )
        except requests.RequestException:
            return "error"
        return resp.json().get("status") or resp.json()["error"]["code"]

    with ThreadPoolExecutor(50) as pool:
        statuses.update(pool.map(one, range(1000)))
    assert burst.accepted <= 100
    assert statuses["sold"] == burst.accepted
    # after the rebuild, selling resumes until the cap is reached
    wait_until(
        lambda: api.post_lead(key, {"lead_id": f"after-{burst.accepted}"}).status_code == 200,
        timeout=45,
        interval=0.3,
        what="routing to resume",
    )
    for i in range(150):
        if api.post_lead(key, {"lead_id": f"fill-{i}"}).json()["status"] == "unsold":
            break
    assert burst.accepted == 100


def _retry_until_answered(api, key: str, lead_id: str) -> dict:
    """A publisher's retries: again on 503 (caps being rebuilt, or a claim's life after the
    loss not over) until an answer comes."""

    def answered():
        resp = api.post_lead(key, {"lead_id": lead_id})
        return resp.json() if resp.status_code == 200 else None

    return wait_until(answered, timeout=45, interval=0.3, what=f"an answer for {lead_id}")


def _publisher_and_two_buyers(api, buyer_server, name: str):
    """Publisher pub-<name> (its API key returned) and buyers <name>-x then <name>-y."""
    first, second = buyer_server.add(f"{name}-x"), buyer_server.add(f"{name}-y")
    key = api.put_publisher(f"pub-{name}")
    api.put_buyer(f"{name}-x", buyer_server.url(f"{name}-x"), priority=1)
    api.put_buyer(f"{name}-y", buyer_server.url(f"{name}-y"), priority=2)
    api.settle_config()
    return key, first, second


def test_a_lead_settled_before_redis_lost_its_data_is_answered_from_the_ledger_not_sold_again(
    api, buyer_server, redis_server, worker
):
    """The publisher retries a lead it sent before Redis restarted empty: the claim that held
    its answer is gone, the ledger still has the sale. The retry gets that answer; no buyer
    is offered the lead again."""
    key, first, second = _publisher_and_two_buyers(api, buyer_server, "settled")
    answer = api.post_lead(key, {"lead_id": "gone-1"}).json()
    assert (answer["status"], answer["buyer_id"]) == ("sold", "settled-x")
    api.wait_settled("gone-1", "pub-settled")
    redis_server.restart_empty()

    again = _retry_until_answered(api, key, "gone-1")
    assert again == {**answer, "replayed": True}
    assert len(first.received) == 1 and second.received == []
    # a new lead of the same publisher is routed as usual once the caps are rebuilt
    assert _retry_until_answered(api, key, "new-1")["buyer_id"] == "settled-x"
    assert api.post_lead(key, {"lead_id": "gone-1"}).json() == {**answer, "replayed": True}


def test_a_lead_still_queued_for_the_ledger_when_redis_lost_its_data_gets_its_answer_back(
    api, app, buyer_server, redis_server, worker_manager
):
    """No worker runs: the sale is only in the settlement queue (lost with Redis) and in the
    web process's journal. The journal pushes it again and puts its answer back, so the retry
    is a replay, and the ledger gets the one sale once a worker drains the queue."""
    worker_manager.stop()
    key, first, second = _publisher_and_two_buyers(api, buyer_server, "queued")
    answer = api.post_lead(key, {"lead_id": "queued-1"}).json()
    assert answer["buyer_id"] == "queued-x"
    redis_server.restart_empty()

    again = _retry_until_answered(api, key, "queued-1")
    assert again == {**answer, "replayed": True}
    assert len(first.received) == 1 and second.received == []
    worker_manager.ensure()
    record = api.wait_settled("queued-1", "pub-queued")
    assert (record["status"], record["buyer_id"]) == ("sold", "queued-x")


def test_a_new_publishers_answers_are_all_in_redis_so_no_lead_asks_the_ledger(api, app, redis_server):
    """A publisher made through the API has no lead anywhere yet: its memory mark says Redis
    holds every answer from the start (lua/claim_lead.lua), so no lead of it costs a ledger
    read. After the mark is lost, leads ask the ledger for LEAD_REPLAY_TTL_S."""
    from webhooks.storage.live import claims, keys

    api.put_publisher("pub-fresh")
    r = services.of(app).store.redis
    assert r.get(keys.lead_memory("pub-fresh")) == "0"
    assert not claims.memory_gap("0", 10**13, 3600)
    assert claims.memory_gap("1000", 1000 + 3_599_999, 3600)
    assert not claims.memory_gap("1000", 1000 + 3_600_000, 3600)
