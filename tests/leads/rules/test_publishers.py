"""Per-publisher rate limits (docs/api.md "Publishers: limits, quality, test mode and payouts" →
`rate_limit`): a token bucket per publisher (lua/bucket.lua), shared by every web process,
taken right after authentication or with the lead's claim (docs/leads.md "Rate limits"): a
lead over it is 429 `rate_limited` with Retry-After, and it is not claimed, routed or stored."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import redis
import requests
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from testkit.servers import wait_until
from tests.conftest import CLUSTER
from webhooks import config, services
from webhooks.errors import ConfigError
from webhooks.storage.live import keys


def _post(
    api, key: str, body: dict | None = None, session: requests.Session | None = None, data: bytes | None = None
) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if data is not None:
        return (session or api.http).post(f"{api.base}/v1/leads", data=data, headers=headers, timeout=30)
    return api.post_lead(key, body or {}, session=session)


def _redis_now_us(redis_server) -> int:
    """Redis's clock (of one node of a cluster: they share this machine's), as the script reads it."""
    seconds, micros = redis.Redis(port=redis_server.port).time()
    return seconds * 1_000_000 + micros


def _refill_bound(start_us: int, end_us: int, per_second: int) -> int:
    """The most tokens a bucket can have gained between two Redis times."""
    return (end_us - start_us) * per_second // 1_000_000


def _is_rate_limited(resp: requests.Response) -> bool:
    """A 429 `rate_limited` of docs/api.md's error shape, with Retry-After whole seconds ≥ 1."""
    if resp.status_code != 429:
        return False
    assert resp.json()["error"]["code"] == "rate_limited" and resp.json()["error"]["message"]
    assert set(resp.json()) == {"error"}
    retry_after = resp.headers["Retry-After"]
    assert retry_after.isdigit() and int(retry_after) >= 1
    return True


def _exhaust(api, key: str, prefix: str, most: int = 500) -> list[requests.Response]:
    """Post leads one after the other until one is refused; every answer, the refusal last."""
    answers = []
    for i in range(most):
        answers.append(_post(api, key, {"lead_id": f"{prefix}{i}"}))
        if answers[-1].status_code != 200:
            return answers
    raise AssertionError(f"{most} leads in a row were accepted")


def _exhaust_bounded(api, redis_server, key: str, prefix: str, per_second: int, burst: int) -> requests.Response:
    """_exhaust a fresh bucket of `burst` at `per_second`, checking that exactly `burst` leads
    were accepted plus at most what it refilled meanwhile (by Redis's clock); the refusal."""
    start = _redis_now_us(redis_server)
    *accepted, refused = _exhaust(api, key, prefix)
    end = _redis_now_us(redis_server)
    assert all(a.status_code == 200 for a in accepted)
    assert burst <= len(accepted) <= burst + _refill_bound(start, end, per_second), len(accepted)
    assert _is_rate_limited(refused)
    return refused


def _scraped(text: str, name: str, **labels) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels == labels
    )


def test_a_burst_is_accepted_then_refused_with_retry_after_and_counted(api, redis_server):
    key = api.put_publisher("surge", rate_limit={"per_second": 1, "burst": 5})
    api.settle_config()
    before = _scraped(api.get("/metrics").text, "floodgate_rate_limited_total", publisher="surge")
    refused = _exhaust_bounded(api, redis_server, key, "b", per_second=1, burst=5)
    assert refused.headers["X-Request-Id"]
    after = _scraped(api.get("/metrics").text, "floodgate_rate_limited_total", publisher="surge")
    assert after - before == 1


def test_a_refused_lead_is_not_parsed_claimed_routed_or_stored(api, buyer_server, redis_server):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge", rate_limit={"per_second": 1, "burst": 1})
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    _exhaust(api, key, "x")
    # The next lead is refused, unless a token came back meanwhile (a whole second: a slow
    # machine); then the one after it is.
    lead_id = next(
        f"held{i}" for i in range(5) if _post(api, key, {"lead_id": f"held{i}", "state": "TX"}).status_code == 429
    )
    r = redis_server.client()
    assert not r.exists(keys.lead_claim("surge", lead_id))
    assert not r.exists(keys.lead_attempt("surge", lead_id))
    assert lead_id not in [post["body"]["lead_id"] for post in acme.received]
    # Not even parsed: a body that is not JSON is refused for the rate, not as invalid_json.
    not_json = [_post(api, key, data=b"{not json") for _ in range(5)]
    assert all(a.status_code == 400 or _is_rate_limited(a) for a in not_json)
    assert any(a.status_code == 429 for a in not_json)
    # Once the bucket has a token again, the same lead_id is routed as a new lead.
    resent = wait_until(
        lambda: (resp := _post(api, key, {"lead_id": lead_id, "state": "TX"})).status_code == 200 and resp,
        timeout=10,
        interval=0.2,
        what="a token",
    )
    assert resent.json()["status"] == "sold" and "replayed" not in resent.json()


def test_another_publisher_is_unaffected(api, redis_server):
    flood = api.put_publisher("flood", rate_limit={"per_second": 1, "burst": 1})
    calm = api.put_publisher("calm", rate_limit={"per_second": 1, "burst": 3})
    api.settle_config()
    assert _is_rate_limited(_exhaust(api, flood, "f")[-1])
    assert [_post(api, calm, {"lead_id": f"c{i}"}).status_code for i in range(3)] == [200] * 3


def test_the_bucket_refills_at_per_second(api):
    key = api.put_publisher("surge", rate_limit={"per_second": 50, "burst": 2})
    api.settle_config()
    assert _is_rate_limited(_exhaust(api, key, "a")[-1])
    resp = wait_until(
        lambda: (r := _post(api, key, {"lead_id": "after"})).status_code == 200 and r,
        timeout=10,
        interval=0.05,
        what="a refilled token",
    )
    assert resp.json()["lead_id"] == "after"


def _burst_at_once(api, key: str, n: int, prefix: str, new_connections: bool = False) -> list[requests.Response]:
    """`n` leads posted by `n` threads released together, each with a session of its own;
    every answer."""
    gate = threading.Barrier(n)
    answers: list[requests.Response] = []
    lock = threading.Lock()

    def post(i: int, session: requests.Session) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        if new_connections:
            headers["Connection"] = "close"  # each its own connection: both workers accept some
        gate.wait()
        resp = session.post(f"{api.base}/v1/leads", json={"lead_id": f"{prefix}{i}"}, headers=headers, timeout=30)
        with lock:
            answers.append(resp)

    sessions = [api.session() for _ in range(n)]
    threads = [threading.Thread(target=post, args=(i, sessions[i])) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == n
    return answers


def _check_burst(answers: list[requests.Response], burst: int, refill: int) -> int:
    """Exactly `burst` accepted, plus at most what the bucket refilled meanwhile; every other
    answer a 429 rate_limited. Returns how many were accepted."""
    accepted = sum(1 for a in answers if a.status_code == 200)
    assert all(a.status_code == 200 or _is_rate_limited(a) for a in answers)
    assert burst <= accepted <= burst + refill, (accepted, refill)
    return accepted


def test_sixty_leads_at_once_against_burst_twenty_accept_exactly_twenty(api, redis_server):
    key = api.put_publisher("surge", rate_limit={"per_second": 1, "burst": 20})
    calm = api.put_publisher("calm", rate_limit={"per_second": 1, "burst": 20})
    api.settle_config()
    start = _redis_now_us(redis_server)
    others: list[requests.Response] = []
    side = threading.Thread(target=lambda: others.extend(_burst_at_once(api, calm, 10, "c")))
    side.start()
    answers = _burst_at_once(api, key, 60, "s")
    side.join()
    end = _redis_now_us(redis_server)
    _check_burst(answers, 20, _refill_bound(start, end, 1))
    assert [a.status_code for a in others] == [200] * 10  # the flood next door took none of calm's


def _refusals_by_process(prom_dir: str, publisher: str) -> dict[str, float]:
    """floodgate_rate_limited_total of `publisher`, per process (its sample file)."""
    found = {}
    for path in Path(prom_dir).glob("counter_*.db"):
        for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(str(path)):
            _metric, name, labels, _help = json.loads(key)
            if name == "floodgate_rate_limited_total" and labels.get("publisher") == publisher and value:
                found[path.stem] = value
    return found


def test_the_bucket_is_shared_by_two_web_processes(web_api, redis_server, base_env):
    """Two gunicorn workers, one bucket: exactly `burst` accepted across both (and both took
    part: each counted refusals of the publisher in its own sample file)."""
    for round_ in range(5):  # the kernel may hand one round's connections to one worker only
        pid = f"shared{round_}"
        key = web_api.put_publisher(pid, rate_limit={"per_second": 1, "burst": 20})
        web_api.settle_config()
        start = _redis_now_us(redis_server)
        answers = _burst_at_once(web_api, key, 60, "s", new_connections=True)
        end = _redis_now_us(redis_server)
        _check_burst(answers, 20, _refill_bound(start, end, 1))
        if len(_refusals_by_process(base_env["PROMETHEUS_MULTIPROC_DIR"], pid)) == 2:
            return
    raise AssertionError("in 5 rounds of 60 connections, one worker never refused a lead")


def test_processes_that_saw_the_bucket_full_still_accept_exactly_what_it_holds(web_api, redis_server, buyer_server):
    """Once a process has seen the bucket hold tokens to spare, a lead's token goes with its
    claim (leads/rules/publishers.py:Buckets). Two gunicorn workers that both saw it full, then
    a burst past it: exactly what the bucket held is accepted, every refusal is 429, and the
    buyer's cap counter holds the sales only (a lead refused at its claim gave back the
    reservation made beside it)."""
    acme = buyer_server.add("acme")
    key = web_api.put_publisher("both", rate_limit={"per_second": 1, "burst": 40})
    web_api.put_buyer("acme", buyer_server.url("acme"), caps={"daily": 1000})
    web_api.settle_config()
    start = _redis_now_us(redis_server)
    headers = {"Authorization": f"Bearer {key}", "Connection": "close"}  # new connections: both workers
    seen = [
        requests.post(f"{web_api.base}/v1/leads", json={"lead_id": f"w{i}"}, headers=headers, timeout=30)
        for i in range(8)
    ]
    answers = _burst_at_once(web_api, key, 60, "s", new_connections=True)
    end = _redis_now_us(redis_server)
    accepted = _check_burst(seen + answers, 40, _refill_bound(start, end, 1))
    assert all(a.json()["status"] == "sold" for a in seen + answers if a.status_code == 200)
    assert len(acme.received) == accepted
    assert web_api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == accepted


def test_the_default_applies_to_a_publisher_without_a_rate_limit(api, redis_server, reconfigure):
    reconfigure(publisher_rate_limit=(1, 3))
    plain = api.put_publisher("plain")
    own = api.put_publisher("own", rate_limit={"per_second": 1, "burst": 6})
    api.settle_config()
    _exhaust_bounded(api, redis_server, plain, "p", per_second=1, burst=3)
    _exhaust_bounded(api, redis_server, own, "o", per_second=1, burst=6)  # its own limit, not the default


def test_no_default_means_no_limit(api, reconfigure):
    reconfigure(publisher_rate_limit=None)
    key = api.put_publisher("plain")
    api.settle_config()
    assert all(_post(api, key, {"lead_id": f"n{i}"}).status_code == 200 for i in range(40))


def test_a_changed_rate_limit_applies_after_the_config_refresh(api, redis_server):
    key = api.put_publisher("surge")
    api.settle_config()
    assert all(_post(api, key, {"lead_id": f"u{i}"}).status_code == 200 for i in range(10))
    api.put_publisher("surge", api_key=key, rate_limit={"per_second": 1, "burst": 2})
    api.settle_config()
    _exhaust_bounded(api, redis_server, key, "l", per_second=1, burst=2)


def test_rate_limit_is_stored_shown_and_put_back(api):
    api.put_publisher("surge", rate_limit={"per_second": 50, "burst": 100})
    shown = api.get("/v1/admin/publishers/surge").json()
    assert shown["rate_limit"] == {"per_second": 50, "burst": 100}
    resp = api.http.put(
        f"{api.base}/v1/admin/publishers/surge",
        headers=api.admin,
        json={**shown, "api_key": "pk_test_surge_0123456789"},
    )
    assert resp.status_code == 200 and resp.json()["rate_limit"] == {"per_second": 50, "burst": 100}
    api.put_publisher("surge", rate_limit={"per_second": 7})  # burst: one second's worth
    assert api.get("/v1/admin/publishers/surge").json()["rate_limit"] == {"per_second": 7, "burst": 7}
    api.put_publisher("surge")  # a PUT replaces: no rate_limit of its own, the default applies
    assert api.get("/v1/admin/publishers/surge").json()["rate_limit"] is None


@pytest.mark.parametrize(
    "rate_limit, field",
    [
        ("fast", "rate_limit"),
        ([50, 100], "rate_limit"),
        ({"burst": 5}, "rate_limit.per_second"),
        ({"per_second": True}, "rate_limit.per_second"),
        ({"per_second": 0}, "rate_limit.per_second"),
        ({"per_second": -1}, "rate_limit.per_second"),
        ({"per_second": 100_001}, "rate_limit.per_second"),
        ({"per_second": 2.5}, "rate_limit.per_second"),
        ({"per_second": "50"}, "rate_limit.per_second"),
        ({"per_second": 5, "burst": 0}, "rate_limit.burst"),
        ({"per_second": 5, "burst": False}, "rate_limit.burst"),
        ({"per_second": 5, "burst": 10**30}, "rate_limit.burst"),
        ({"per_second": 5, "burst": 5, "window": 1}, "rate_limit.window"),
    ],
)
def test_invalid_rate_limit_is_refused_naming_the_field(api, rate_limit, field):
    resp = api.http.put(
        f"{api.base}/v1/admin/publishers/surge",
        headers=api.admin,
        json={"name": "Surge", "api_key": "pk_test_surge_0123456789", "rate_limit": rate_limit},
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_publisher"
    assert resp.json()["error"]["message"].startswith(field + ":")
    assert api.get("/v1/admin/publishers/surge").status_code == 404


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("50/100", (50, 100)),
        ("50", (50, 50)),
        (" 7/9 ", (7, 9)),
        ("off", None),
        ("OFF", None),
        ("0", None),
        ("", (100, 200)),
    ],
)
def test_publisher_rate_limit_from_the_environment(raw, expected):
    assert config.load({"PUBLISHER_RATE_LIMIT": raw}).publisher_rate_limit == expected
    assert config.load({}).publisher_rate_limit == (100, 200)


@pytest.mark.parametrize(
    "raw",
    ["abc", "0/5", "5/0", "100001/1", "1/100001", "-1", "1.5", "50/100/2", "50 / 100", "\u0665\u0660", "1e3", "50/"],
)
def test_bad_publisher_rate_limit_stops_start_up(raw):
    with pytest.raises(ConfigError, match="PUBLISHER_RATE_LIMIT"):
        config.load({"PUBLISHER_RATE_LIMIT": raw})


def test_the_script_leaves_nothing_behind_once_the_bucket_is_full_again(app, redis_server):
    store = services.of(app).store
    r = redis_server.client()
    first = store.take_token("idle", 1, 2)
    assert first.allowed and first.wait_ms == 0
    assert 0 < r.pttl(keys.rate_bucket("idle")) <= 1001  # one token short at 1/s: full in a second
    wait_until(lambda: not r.exists(keys.rate_bucket("idle")), timeout=5, what="the bucket to expire")


def test_a_refusal_writes_nothing_and_says_how_long_to_wait(app, redis_server):
    store = services.of(app).store
    r = redis_server.client()
    assert store.take_token("slow", 1, 1).allowed
    before = r.hgetall(keys.rate_bucket("slow"))
    refused = store.take_token("slow", 1, 1)
    if refused.allowed:  # a whole second passed between two calls: try once more
        before = r.hgetall(keys.rate_bucket("slow"))
        refused = store.take_token("slow", 1, 1)
    assert not refused.allowed and 1 <= refused.wait_ms <= 1000
    assert r.hgetall(keys.rate_bucket("slow")) == before


@pytest.mark.skipif(
    CLUSTER,
    reason="cluster run: killing every node and forming the cluster again is tests/e2e/test_cluster.py's subject",
)
def test_redis_down_is_503_unavailable_and_no_lead_is_routed(api, buyer_server, redis_server):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge", rate_limit={"per_second": 100, "burst": 100})
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    assert _post(api, key, {"lead_id": "up"}).status_code == 200
    redis_server.kill()
    try:
        resp = _post(api, key, {"lead_id": "down"})
    finally:
        redis_server.start()
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "unavailable"
    assert [r["body"]["lead_id"] for r in acme.received] == ["up"]
