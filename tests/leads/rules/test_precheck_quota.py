"""What a pre-ping may tell and how many a publisher may make (docs/leads.md "What a pre-ping
may tell", "Pre-ping quota"): a consumer on a buyer's suppression list, one another publisher
sold and one no buyer has room for answer alike; at most daily_floor + per_lead x the leads
posted in the last 24 hours, taken atomically (real concurrency, many at once), 429
precheck_quota with Retry-After beyond it; counted per publisher in the metrics and usage.
Against the real app, Redis and database."""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from webhooks.leads.rules import precheck_quota

DAY_S = 24 * 3600


def check(api, key: str, body: dict, session=None):
    return (session or api.http).post(
        f"{api.base}/v1/leads/check", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def at_once(api, key: str, n: int, prefix: str) -> list:
    """`n` pre-pings sent at the same moment from `n` threads, each with its own session."""
    start = threading.Barrier(n, timeout=60)
    sessions = [api.session() for _ in range(n)]

    def one(i: int):
        start.wait()
        return check(api, key, {"lead_id": f"{prefix}-{i}"}, sessions[i])

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_suppressed_sold_elsewhere_and_no_room_answer_alike(api, buyer_server):
    """`keen` dedupes on e-mail, suppresses the list `dnc` and takes 2 leads a day; `texan`
    takes Texans only. Publisher `b` sells `keen` a consumer; publisher `a` pre-pings."""
    for name in ("keen", "texan"):
        buyer_server.add(name)
    resp = api.http.put(
        f"{api.base}/v1/admin/suppression-lists/dnc", json={"field": "email", "hash": "md5"}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text
    listed = hashlib.md5(b"sup@example.com").hexdigest()
    resp = api.http.post(
        f"{api.base}/v1/admin/suppression-lists/dnc/entries", json={"add": [listed]}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text
    a, b = api.put_publisher("a"), api.put_publisher("b")
    api.put_buyer(
        "keen", buyer_server.url("keen"), priority=1, suppress=["dnc"], dedupe={"fields": ["email"]}, caps={"daily": 2}
    )
    api.put_buyer("texan", buyer_server.url("texan"), priority=2, states=["TX"])
    api.settle_config()
    sold = api.post_lead(b, {"lead_id": "b-1", "email": "sold@example.com"}).json()
    assert (sold["status"], sold["buyer_id"]) == ("sold", "keen")

    # two buyers might take a Texan: the answers are those of a consumer nobody knows
    texans = [
        check(api, a, {"lead_id": f"tx-{who}", "email": f"{who}@example.com", "state": "TX"})
        for who in ("fresh", "sup", "sold")
    ]
    assert {(r.status_code, r.text) for r in texans} == {(200, texans[0].text)}
    assert texans[0].json() == {"eligible": True, "duplicate": False}

    # `keen` alone: a consumer it suppresses, one it bought from `b`, and (once `b` has filled
    # its cap) one it has no room for, answer alike
    assert check(api, a, {"lead_id": "x-fresh", "email": "fresh@example.com"}).json()["eligible"] is True
    suppressed = check(api, a, {"lead_id": "x-sup", "email": "sup@example.com"})
    elsewhere = check(api, a, {"lead_id": "x-sold", "email": "sold@example.com"})
    assert api.post_lead(b, {"lead_id": "b-2", "email": "fill@example.com"}).json()["buyer_id"] == "keen"
    no_room = check(api, a, {"lead_id": "x-full", "email": "fresh@example.com"})
    assert (suppressed.status_code, suppressed.text) == (no_room.status_code, no_room.text)
    assert (elsewhere.status_code, elsewhere.text) == (no_room.status_code, no_room.text)
    assert no_room.json() == {"eligible": False, "duplicate": False}
    # its own lead_id sent before is what `duplicate` says
    assert check(api, b, {"lead_id": "b-1", "email": "sold@example.com"}).json()["duplicate"] is True


def test_a_suppressed_consumer_takes_from_the_quota_as_any_other(api):
    resp = api.http.put(
        f"{api.base}/v1/admin/suppression-lists/dnc", json={"field": "email", "hash": "none"}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text
    resp = api.http.post(
        f"{api.base}/v1/admin/suppression-lists/dnc/entries", json={"add": ["sup@example.com"]}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text
    key = api.put_publisher("strict", suppress=["dnc"], precheck={"per_lead": 0, "daily_floor": 2})
    api.settle_config()
    assert check(api, key, {"email": "sup@example.com"}).json() == {"eligible": False, "duplicate": False}
    assert check(api, key, {"email": "new@example.com"}).status_code == 200
    for email in ("sup@example.com", "new@example.com"):
        assert check(api, key, {"email": email}).json()["error"]["code"] == "precheck_quota"


def test_pre_pings_at_once_never_pass_the_quota_and_posted_leads_raise_it(api, buyer_server):
    buyer_server.add("acme")
    key = api.put_publisher("scan", precheck={"per_lead": 3, "daily_floor": 5})
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()

    answers = at_once(api, key, 40, "q")
    assert sorted(r.status_code for r in answers) == [200] * 5 + [429] * 35
    refused = [r for r in answers if r.status_code == 429]
    assert {r.json()["error"]["code"] for r in refused} == {"precheck_quota"}
    assert all(set(r.json()["error"]) >= {"code", "message"} for r in refused)
    # nothing leaves the window before this hour's pre-pings do: a day, less this hour's part
    assert all(22 * 3600 < int(r.headers["Retry-After"]) <= DAY_S for r in refused)

    # two leads posted: 3 pre-pings more each; a test lead and a replay raise nothing
    for lead_id in ("p-1", "p-2"):
        assert api.post_lead(key, {"lead_id": lead_id}).status_code == 200
    assert api.post_lead(key, {"lead_id": "p-1"}).json()["replayed"] is True
    assert api.post_lead(key, {"lead_id": "t-1", "test": True}).status_code == 200
    answers = at_once(api, key, 40, "r")
    assert sorted(r.status_code for r in answers) == [200] * 6 + [429] * 34
    usage = api.get("/v1/admin/publishers/scan").json()["usage"]["precheck"]
    assert (usage["used"], usage["limit"]) == (11, 11)
    assert usage["window_start"] == precheck_quota.hours(datetime.now(timezone.utc))[-1]


def _plant(redis_server, publisher_id: str, now: datetime, *, posted: dict, prechecks: dict) -> None:
    """Counts of leads and pre-pings in the window's hours, by how many hours back."""
    leads, pings = precheck_quota.counters(publisher_id, now)
    r = redis_server.client()
    for ago, n in posted.items():
        r.set(leads[ago], n, ex=DAY_S)
    for ago, n in prechecks.items():
        r.set(pings[ago], n, ex=DAY_S)


def _seconds_to(hours: int, now: datetime) -> float:
    return hours * 3600 - (now.minute * 60 + now.second + now.microsecond / 1e6)


@pytest.mark.parametrize(
    "quota, posted, prechecks, wait_hours",
    [
        # the oldest hour's pre-pings leave the window at the next hour
        ({"per_lead": 0, "daily_floor": 3}, {}, {23: 2, 10: 1}, 1),
        # the leads of the oldest hour leave with it, and take their pre-pings' room along
        ({"per_lead": 1, "daily_floor": 1}, {23: 4}, {22: 2, 0: 3}, 24),
        ({"per_lead": 2, "daily_floor": 0}, {20: 1, 5: 1}, {21: 1, 6: 3}, 3),
        ({"per_lead": 2, "daily_floor": 0}, {21: 1, 5: 1}, {20: 1, 6: 3}, 18),
    ],
)
def test_retry_after_is_the_first_hour_a_pre_ping_would_fit(api, redis_server, quota, posted, prechecks, wait_hours):
    key = api.put_publisher("old", precheck=quota)
    api.settle_config()
    while True:  # planted and answered within one UTC hour (else planted again)
        now = datetime.now(timezone.utc)
        _plant(redis_server, "old", now, posted=posted, prechecks=prechecks)
        resp = check(api, key, {"lead_id": "late"})
        if datetime.now(timezone.utc).hour == now.hour:
            break
        r = redis_server.client()
        r.delete(*r.keys("fg:{p:old}:precheck:*"), *r.keys("fg:{p:old}:cap:hourly:*"))
    assert resp.status_code == 429 and resp.json()["error"]["code"] == "precheck_quota"
    retry_after = int(resp.headers["Retry-After"])
    assert _seconds_to(wait_hours, now) - 60 <= retry_after <= _seconds_to(wait_hours, now) + 1


def _scraped(api, **labels) -> float:
    text = api.get("/metrics").text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "floodgate_prechecks_total" and s.labels == labels
    )


def test_pre_pings_are_counted_per_publisher(api):
    one, other = api.put_publisher("one", precheck={"daily_floor": 2}), api.put_publisher("other")
    api.settle_config()
    before = {o: _scraped(api, publisher="one", outcome=o) for o in ("answered", "refused")}
    others = _scraped(api, publisher="other", outcome="answered")
    assert [check(api, one, {}).status_code for _ in range(3)] == [200, 200, 429]
    assert check(api, other, {}).status_code == 200
    assert _scraped(api, publisher="one", outcome="answered") - before["answered"] == 2
    assert _scraped(api, publisher="one", outcome="refused") - before["refused"] == 1
    assert _scraped(api, publisher="other", outcome="answered") - others == 1
    usage = api.get("/v1/admin/publishers/one").json()["usage"]
    assert (usage["precheck"]["used"], usage["precheck"]["limit"]) == (2, 2)
    assert api.get("/v1/admin/publishers/other").json()["usage"]["precheck"]["used"] == 1


@pytest.mark.parametrize(
    "value, field",
    [
        ([], "precheck"),
        ("10", "precheck"),
        ({"per_lead": "10"}, "precheck.per_lead"),
        ({"per_lead": True}, "precheck.per_lead"),
        ({"per_lead": 1.5}, "precheck.per_lead"),
        ({"per_lead": -1}, "precheck.per_lead"),
        ({"per_lead": 10**6}, "precheck.per_lead"),
        ({"daily_floor": 10**10}, "precheck.daily_floor"),
        ({"daily_floor": {"a": [[[]]]}}, "precheck.daily_floor"),
        ({"hourly": 5}, "precheck.hourly"),
        ({"x\u0000\r\n" + "y" * 300: 1}, "precheck.x\u0000\r\n" + "y" * 60),
    ],
)
def test_a_quota_that_cannot_be_kept_is_refused(api, value, field):
    body = {"name": "Q", "api_key": "pk_test_q_0123456789", "precheck": value}
    put = api.http.put(f"{api.base}/v1/admin/publishers/q", json=body, headers=api.admin)
    assert put.status_code == 400, put.text
    assert put.json()["error"]["code"] == "invalid_publisher"
    assert put.json()["error"]["message"].startswith(field + ":")
    api.put_publisher("q")
    patched = api.http.patch(f"{api.base}/v1/admin/publishers/q", json={"precheck": value}, headers=api.admin)
    assert patched.status_code == 400 and patched.json()["error"]["message"].startswith(field + ":")


def test_the_quota_defaults_and_is_changed_member_by_member(api):
    api.put_publisher("q")
    assert api.get("/v1/admin/publishers/q").json()["precheck"] == {"per_lead": 10, "daily_floor": 1000}
    patch = {"precheck": {"daily_floor": 0}}
    resp = api.http.patch(f"{api.base}/v1/admin/publishers/q", json=patch, headers=api.admin)
    assert resp.status_code == 200 and resp.json()["precheck"] == {"per_lead": 10, "daily_floor": 0}
    patch = {"precheck": {"daily_floor": None}}  # null: the default again
    resp = api.http.patch(f"{api.base}/v1/admin/publishers/q", json=patch, headers=api.admin)
    assert resp.json()["precheck"] == {"per_lead": 10, "daily_floor": 1000}
