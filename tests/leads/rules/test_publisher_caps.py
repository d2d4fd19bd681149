"""Publisher caps (docs/api.md "Publishers: limits, quality, test mode and payouts", `caps`): leads
accepted per UTC hour and day, counted atomically with the lead's claim (lua/claim_lead.lua):
over a cap, 429 publisher_cap_reached with Retry-After to the next window; a replay is never
counted again, nor a lead the field spec or the rate limit refused. Real concurrency, checked
against the count and the buyer."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pytest


def test_50_concurrent_leads_against_a_cap_of_20_accept_exactly_20_and_replays_are_free(api, buyer_server):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge", caps={"hourly": 20, "daily": 1000})
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    start = threading.Barrier(50, timeout=60)

    def post(i: int):
        start.wait()
        return api.post_lead(key, {"lead_id": f"cap-{i:02}"})

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(post, range(50)))
    accepted = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert (len(accepted), len(refused)) == (20, 30), [r.status_code for r in answers]
    assert all(r.json()["error"]["code"] == "publisher_cap_reached" for r in refused)
    now = datetime.now(timezone.utc)
    to_next_hour = 3600 - (now.minute * 60 + now.second)
    assert all(1 <= int(r.headers["Retry-After"]) <= to_next_hour + 1 for r in refused)
    assert len(acme.received) == 20
    usage = api.get("/v1/admin/publishers/surge").json()["usage"]
    assert (usage["hourly"]["used"], usage["hourly"]["limit"]) == (20, 20)
    assert usage["daily"]["used"] == 20
    # a replay of an accepted lead is answered, not counted and not refused
    first = accepted[0].json()["lead_id"]
    again = api.post_lead(key, {"lead_id": first})
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert api.get("/v1/admin/publishers/surge").json()["usage"]["hourly"]["used"] == 20


def test_leads_refused_by_the_spec_or_the_rate_limit_and_test_leads_are_not_counted(api, buyer_server):
    buyer_server.add("acme")
    key = api.put_publisher(
        "surge",
        caps={"hourly": 2},
        fields={"email": {"type": "email", "required": True}},
        rate_limit={"per_second": 1, "burst": 3},
    )
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "bad", "email": "nope"}).status_code == 400  # spec: not counted
    assert api.post_lead(key, {"lead_id": "t", "email": "a@b.co", "test": True}).json()["test"] is True
    assert api.post_lead(key, {"lead_id": "ok-1", "email": "a@b.co"}).status_code == 200
    limited = api.post_lead(key, {"lead_id": "ok-2", "email": "a@b.co"})
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limited"  # not counted
    used = api.get("/v1/admin/publishers/surge").json()["usage"]["hourly"]["used"]
    assert used == 1


@pytest.mark.parametrize(
    "caps, field",
    [({"weekly": 5}, "caps.weekly"), ({"hourly": -1}, "caps.hourly"), ({"daily": "10"}, "caps.daily"), ([], "caps")],
)
def test_caps_that_cannot_be_kept_are_refused(api, caps, field):
    resp = api.http.put(
        f"{api.base}/v1/admin/publishers/surge",
        json={"name": "Surge", "api_key": "pk_test_surge_0123456789", "caps": caps},
        headers=api.admin,
    )
    assert resp.status_code == 400 and resp.json()["error"]["message"].startswith(field)


def test_a_cap_of_zero_accepts_nothing_and_the_publishers_caps_are_shown(api, buyer_server):
    buyer_server.add("acme")
    key = api.put_publisher("surge", caps={"daily": 0})
    assert api.get("/v1/admin/publishers/surge").json()["caps"] == {"daily": 0}
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    resp = api.post_lead(key, {"lead_id": "z-1"})
    assert resp.status_code == 429 and resp.json()["error"]["code"] == "publisher_cap_reached"
    assert int(resp.headers["Retry-After"]) >= 1
