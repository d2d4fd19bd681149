"""A delivery that fails its signature check writes nothing to the database, takes no
connection from it, and leaves a metric and an entry in a capped Redis list (provider,
length, body hash, time; the last 1,000), never its body, headers or signature."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from datetime import datetime, timedelta, timezone
from urllib.parse import urlparse

import pytest

from testkit.payments import PROVIDERS, balance, deliver, encode, payload, signed_headers
from testkit.servers import TcpProxy, wait_until
from webhooks import services
from webhooks.storage.live import keys
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.records.db import db, make_database
from webhooks.storage.records.models import ALL_MODELS, WebhookCall

MARKER = "forged-marker-7d1c"
# A forger's secret that names the marker (a whsec_ one, so that Standard Webhooks can sign with it).
FORGER = "whsec_" + base64.b64encode(f"{MARKER}-secret".encode()).decode()
LIST_CAP = 1000


def table_counts() -> dict[str, int]:
    """Rows in every table of the schema."""
    with db.connection_context():
        return {model.__name__: model.select().count() for model in ALL_MODELS}


def listed(redis_server) -> list[dict]:
    """The rejected-webhook list, newest first."""
    return [json.loads(raw) for raw in redis_server.client().lrange(keys.REJECTED_WEBHOOKS, 0, -1)]


def redis_text(redis_server) -> str:
    """Every key and value in Redis as one string, to look for what a forger sent (read as
    bytes: RQ's job data beside it is compressed pickle, no text)."""
    client, parts = redis_server.client(decode_responses=False), []
    readers = {
        "string": client.get,
        "list": lambda k: client.lrange(k, 0, -1),
        "hash": client.hgetall,
        "set": client.smembers,
        "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
        "stream": lambda k: client.xrange(k),
        "none": lambda k: None,  # gone since the scan listed it (a worker's lock, a wake-up)
    }
    for key in client.scan_iter(count=1000):
        parts.append(f"{key!r}={readers[client.type(key).decode()](key)!r}")
    return "\n".join(parts)


def metric(api, name: str, provider: str, status: str | None = None) -> float:
    text = api.http.get(api.base + "/metrics").text
    labels = f'provider="{provider}"' + (f',status="{status}"' if status else "")
    match = re.search(r"^%s\{%s\} (\S+)$" % (name, labels), text, re.M)
    return float(match.group(1)) if match else 0.0


def rejected_count(api, provider: str) -> float:
    return metric(api, "floodgate_payment_deliveries_total", provider, "invalid_signature")


def forged(provider: str, ref: str = "ref", pad: int = 0) -> tuple[bytes, dict]:
    """A body naming the marker, signed with the forger's secret, with marker-laden headers."""
    raw = encode(payload(provider, f"{MARKER}-{ref}", 100000, email=f"{MARKER}@example.com"))
    raw += b" " * pad
    return raw, {**signed_headers(provider, raw, secret=FORGER), "User-Agent": MARKER, "X-Forwarded-For": MARKER}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_forged_webhook_call_leaves_one_list_entry_a_metric_and_no_row(api, redis_server, provider):
    raw, headers = forged(provider, pad=200_000)  # a big body: none of it may be stored
    before, tables = rejected_count(api, provider), table_counts()
    before_bytes = metric(api, "floodgate_payment_rejected_bytes_total", provider)
    resp = deliver(api, provider, raw, headers={**headers, "X-Request-Id": "forged-rid.1"})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_signature"

    assert table_counts() == tables  # no WebhookCall row, nor any other
    (entry,) = listed(redis_server)
    assert entry == {
        "provider": provider,
        "body_length": len(raw),
        "body_sha256": hashlib.sha256(raw).hexdigest(),
        "received_at": entry["received_at"],
        "request_id": resp.headers["X-Request-Id"],
    }
    assert entry["request_id"] == "forged-rid.1"
    at = datetime.fromisoformat(entry["received_at"].removesuffix("Z")).replace(tzinfo=timezone.utc)
    assert entry["received_at"].endswith("Z") and abs(datetime.now(timezone.utc) - at) < timedelta(minutes=1)
    everything = redis_text(redis_server)
    # body, headers, signature, secret: none of it (a bare unix time such as Standard Webhooks'
    # webhook-timestamp is no marker: RQ's own keys hold the same second)
    for sent in (MARKER, FORGER, FORGER.removeprefix("whsec_"), *headers.values()):
        if not sent.isdigit():
            assert sent not in everything, sent
    assert rejected_count(api, provider) == before + 1
    assert metric(api, "floodgate_payment_rejected_bytes_total", provider) == before_bytes + len(raw)


def test_a_flood_from_many_threads_keeps_exactly_the_last_1000_and_writes_no_row(api, redis_server):
    threads, each = 12, 100  # 1,200 forged deliveries, twelve at a time
    tables = table_counts()
    before = {p: rejected_count(api, p) for p in PROVIDERS}
    sent: dict[str, tuple[int, int]] = {}  # body hash -> (thread, its n-th delivery)
    answers: list[int] = []
    lock = threading.Lock()

    def flood(t: int) -> None:
        session = api.session()
        for n in range(each):
            provider = PROVIDERS[(t + n) % len(PROVIDERS)]
            raw = f'{{"junk": "{MARKER}-{t}-{n}", "pad": "{"x" * 2000}"}}'.encode()
            with lock:
                sent[hashlib.sha256(raw).hexdigest()] = (t, n)
            status = deliver(api, provider, raw, headers={}, session=session).status_code
            with lock:
                answers.append(status)

    workers = [threading.Thread(target=flood, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert answers == [401] * threads * each

    entries = listed(redis_server)
    assert len(entries) == LIST_CAP
    assert table_counts() == tables
    # Each thread sent one after the other, so the list holds, per thread, its last deliveries
    # newest first: a run n, n-1, ..., ending at its very last one.
    seen: dict[int, list[int]] = {}
    for e in entries:
        t, n = sent[e["body_sha256"]]
        seen.setdefault(t, []).append(n)
    assert sum(map(len, seen.values())) == LIST_CAP
    for t, ns in seen.items():
        assert ns == list(range(each - 1, each - 1 - len(ns), -1)), t
    assert sum(rejected_count(api, p) - before[p] for p in PROVIDERS) == threads * each
    assert MARKER not in redis_text(redis_server)


def test_admin_lists_them_newest_first_filtered_by_provider(api):
    order = ["paystack", "stripe", "paystack", "flutterwave", "stripe", "paystack"]
    hashes = []
    for i, provider in enumerate(order):
        raw, headers = forged(provider, ref=str(i))
        assert deliver(api, provider, raw, headers=headers).status_code == 401
        hashes.append(hashlib.sha256(raw).hexdigest())
    newest_first = list(zip(reversed(order), reversed(hashes)))

    def listing(**params) -> tuple[list[tuple[str, str]], int]:
        resp = api.get("/v1/admin/webhooks/rejected", params=params)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert set(body) == {"rejected", "count"}
        return [(e["provider"], e["body_sha256"]) for e in body["rejected"]], body["count"]

    assert listing() == (newest_first, 6)
    assert listing(provider="stripe") == ([e for e in newest_first if e[0] == "stripe"], 6)
    assert listing(limit="2") == (newest_first[:2], 6)
    assert listing(provider="paystack", limit="1") == (newest_first[:1], 6)
    assert listing(provider="monnify") == ([], 6)
    for params in (
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "-1"},
        {"limit": "2.5"},
        {"limit": "9" * 5000},
        {"limit": "١٠"},
        {"provider": "nobody"},
    ):
        resp = api.get("/v1/admin/webhooks/rejected", params=params)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_query", (params, resp.text)
    assert listing(provider="") == listing()  # an empty field is no filter, as a form sends it
    resp = api.http.get(api.base + "/v1/admin/webhooks/rejected")
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"


def test_ops_page_shows_the_count_and_the_last_rejected_webhooks(api):
    hashes = []
    for i, provider in enumerate(("monnify", "interswitch")):
        raw, headers = forged(provider, ref=str(i))
        assert deliver(api, provider, raw, headers=headers).status_code == 401
        hashes.append(hashlib.sha256(raw).hexdigest())
    page = api.get("/ops")
    assert page.status_code == 200
    html = page.text
    assert 'id="rejected-webhooks" data-count="2"' in html
    section = html[html.index('id="rejected"') :]
    section = section[: section.index("</table>")]
    rows = re.findall(r'<tr data-sha256="([0-9a-f]{64})">', section)
    assert rows == hashes[::-1]  # newest first
    assert all(f"{h[:12]}…" in section for h in hashes) and "interswitch" in section
    assert MARKER not in html


@pytest.fixture
def db_through_proxy(database_url):
    """The app's database reached through a TCP proxy that counts the connections it passes
    on (and can be cut), for the length of one test."""
    parts = urlparse(database_url)
    if parts.scheme != "mysql":
        pytest.skip("counts TCP connections to MySQL/MariaDB")
    proxy = TcpProxy(parts.hostname, parts.port or 3306)
    original, proxied = db.obj, make_database(proxy.url_for(database_url), pool_size=2)
    db.initialize(proxied)
    try:
        yield proxy
    finally:
        db.close()
        db.initialize(original)
        proxied.close_all()
        proxy.stop()


def test_a_forged_webhook_call_takes_no_database_connection(api, db_through_proxy):
    proxy = db_through_proxy
    for provider in PROVIDERS:
        raw, headers = forged(provider)
        assert deliver(api, provider, raw, headers=headers).status_code == 401
    assert proxy._conns == []  # not one connection was opened through it
    # The control: a genuine delivery does reach the database through the proxy.
    genuine = encode(payload("paystack", "ps-through-proxy", 2500))
    assert deliver(api, "paystack", genuine).json() == {"status": "credited"}
    assert proxy._conns != []

    proxy.stop()  # the database is now unreachable: forged deliveries still get their 401
    for provider in PROVIDERS:
        raw, headers = forged(provider, ref="db-down")
        resp = deliver(api, provider, raw, headers=headers)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_signature"


def test_with_redis_down_a_forged_webhook_call_is_still_401_and_counted(api, redis_server):
    raw, headers = forged("stripe")
    before = rejected_count(api, "stripe")
    redis_server.kill()
    try:
        resp = deliver(api, "stripe", raw, headers=headers)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_signature"
        assert rejected_count(api, "stripe") == before + 1
    finally:
        redis_server.start()
        wait_until(lambda: _app_redis_answers(api), what="the app's Redis client to reconnect")
    assert table_counts()["WebhookCall"] == 0


def _app_redis_answers(api) -> bool:
    try:
        return services.of(api.app).store.redis.ping()
    except REDIS_DOWN:
        return False


def test_verified_webhook_call_keeps_body_headers_and_the_same_metadata(api, redis_server):
    raw = encode(payload("paystack", "ps-kept", 5000))
    assert deliver(api, "paystack", raw).json() == {"status": "credited"}
    with db.connection_context():
        (row,) = WebhookCall.select()
    assert bytes(row.body) == raw and "x-paystack-signature" in json.loads(row.headers)
    assert (row.body_length, row.body_sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
    assert listed(redis_server) == []
    assert balance("ada@example.com", "NGN") == 5000
