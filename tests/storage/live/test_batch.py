"""Redis round trips of the lead path, counted on the wire (issue "Performance": a lead sold at
its first buyer costs two: claim + reserve, then confirm + answer + settle). The lead path is
built from the same config as the app's, on a Redis client whose connections count what they
send; a real buyer and the real Redis answer."""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import datetime, timezone

import pytest
import redis

from webhooks import config
from webhooks.errors import RateLimited, ValidationError
from webhooks.leads.path.intake import Intake, LeadRequest
from webhooks.leads.path.settlement import Journal
from webhooks.leads.rules.catalog import load_snapshot
from webhooks.storage.live import keys
from webhooks.storage.live.redis import Store
from webhooks.storage.live.settle_queue import queue
from webhooks.storage.records.db import db

SENT: Counter = Counter()  # round trips per thread
WHAT: dict[int, list[bytes]] = {}  # per thread, the start of each write (said when a count is off)


class CountingConnection(redis.Connection):
    """A connection that counts each write to the server (a command, or a whole pipeline); not
    the handshake of a connection the pool opens meanwhile (another thread of the process, the
    journal's, may hold the open one at that moment): a round trip of the path is what counts."""

    handshaking = False

    def on_connect_check_health(self, check_health=True):  # redis-py's handshake (HELLO, CLIENT...)
        self.handshaking = True
        try:
            super().on_connect_check_health(check_health)
        finally:
            self.handshaking = False

    def send_packed_command(self, command, check_health=True):
        if self.handshaking:
            return super().send_packed_command(command, check_health)
        SENT[threading.get_ident()] += 1
        first = command if isinstance(command, bytes) else b"".join(command[:2])
        WHAT.setdefault(threading.get_ident(), []).append(first[:60])
        return super().send_packed_command(command, check_health)


@pytest.fixture
def counted(api, base_env, redis_server):
    cfg = config.load(base_env)
    pool = redis.ConnectionPool.from_url(redis_server.url, connection_class=CountingConnection, decode_responses=True)
    store = Store(redis.Redis(connection_pool=pool))
    store.redis.ping()  # open the connection now: its handshake is not the lead path's
    # Every script in Redis's cache now: whether an earlier test on this Redis ran a script
    # (or restarted it empty) must not add its loading to the round trips counted here.
    for script in store.scripts.values():
        store.redis.script_load(script.script)
    journal = Journal(store.redis, queue(redis.Redis.from_url(redis_server.url)), 30)
    yield Intake.build(cfg, store, store, journal)
    # Its watcher thread lives on: left full, it would push this test's settlements again into
    # a later test that simulates a Redis loss.
    journal.clear()


def _take(intake: Intake, api_key_owner: str, lead_id: str, lead: dict) -> tuple[str, int]:
    with db.connection_context():
        snapshot = load_snapshot("test")
    publisher = next(p for p in snapshot.publishers_by_key.values() if p.id == api_key_owner)
    me = threading.get_ident()
    before = SENT[me]
    WHAT[me] = []
    answer = intake.take(
        snapshot,
        publisher=publisher,
        lead_id=lead_id,
        lead=lead,
        payload="{}",
        received_at=datetime.now(timezone.utc),
        request_id=None,
    )
    return answer.text, SENT[me] - before


def test_a_lead_sold_at_its_first_buyer_costs_two_round_trips(api, buyer_server, counted):
    buyer_server.add("acme")
    api.put_publisher("surge")
    api.put_buyer(
        "acme",
        buyer_server.url("acme"),
        caps={"daily": 10, "daily_budget": "500.00"},
        dedupe={"fields": ["email"], "days": 1},
    )
    answer, trips = _take(counted, "surge", "rt-1", {"email": "a@x.io"})
    assert '"status": "sold"' in answer
    assert trips == 2


def test_each_further_buyer_costs_a_reservation_and_a_refund(api, buyer_server, counted):
    buyer_server.add("no", "reject")
    buyer_server.add("yes")
    api.put_publisher("surge")
    api.put_buyer("no", buyer_server.url("no"), priority=1)
    api.put_buyer("yes", buyer_server.url("yes"), priority=2)
    answer, trips = _take(counted, "surge", "rt-2", {})
    assert '"buyer_id": "yes"' in answer
    assert trips == 4  # claim + reserve "no"; refund "no"; reserve "yes"; confirm + answer + settle


def test_a_replay_gives_back_the_reservation_made_with_its_claim(api, buyer_server, counted):
    buyer = buyer_server.add("acme")
    api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"), caps={"daily": 5})
    _take(counted, "surge", "rt-3", {})
    answer, trips = _take(counted, "surge", "rt-3", {})
    assert '"replayed": true' in answer and len(buyer.received) == 1
    # the claim's round trip, and the withdrawal of the speculative reservation
    assert trips == 2, WHAT[threading.get_ident()]
    assert api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == 1


def _counted_trips(call) -> tuple[object, int]:
    me = threading.get_ident()
    before = SENT[me]
    result = call()
    return result, SENT[me] - before


def test_a_duplicate_payment_costs_one_round_trip_and_no_database_write(api, counted, redis_server):
    """Issue "Performance": dedupe and claim are one script; a delivery that changes nothing
    has its audit row queued in that same script, and the database sees it only when the
    settlement drain writes its batch."""
    from testkit.payments import encode, payload
    from webhooks.payments import gate, ledger
    from webhooks.payments.providers import notifications
    from webhooks.storage.live import keys
    from webhooks.storage.records.models import WebhookCall
    from workers.settle import write_webhook_calls

    # A Redis database of its own: the run's RQ worker (started by an earlier test under xdist)
    # drains db 0's audit list and would take rows from under the count below.
    pool = redis.ConnectionPool.from_url(
        redis_server.url.rsplit("/", 1)[0] + "/7", connection_class=CountingConnection, decode_responses=True
    )
    store, q = Store(redis.Redis(connection_pool=pool)), counted.journal.queue
    store.redis.flushdb()
    for script in store.scripts.values():
        store.redis.script_load(script.script)
    raw = encode(payload("paystack", "rt-pay-1", 5000))
    note = notifications.parse("paystack", raw)
    delivery = ledger.receipt("paystack", raw, {"content-type": "application/json"})
    first, trips = _counted_trips(lambda: gate.enter(store, store, q, note, delivery, claim_ttl_ms=30_000))
    assert (first.verdict, trips) == ("claimed", 1)
    again, trips = _counted_trips(lambda: gate.enter(store, store, q, note, delivery, claim_ttl_ms=30_000))
    assert (again.verdict, trips) == ("in_flight", 1)
    with db.connection_context():
        assert ledger.credit(note, delivery, False) == "credited"
    _, trips = _counted_trips(lambda: gate.finish(store, note, first.claim, processed=True))
    assert trips == 1 and store.redis.exists(gate.claim_key(note)) == 0

    def rows() -> list[str]:
        with db.connection_context():
            return [d.verdict for d in WebhookCall.select().order_by(WebhookCall.received_at)]

    assert rows() == ["credited"]
    repeat, trips = _counted_trips(lambda: gate.enter(store, store, q, note, delivery, claim_ttl_ms=30_000))
    assert (repeat.verdict, repeat.claim, trips) == ("duplicate", None, 1)
    assert rows() == ["credited"]  # nothing written on the request path
    assert store.redis.llen(keys.WEBHOOK_CALLS_PENDING) == 2  # the in-flight one and the duplicate
    with db.connection_context():
        assert write_webhook_calls(store, "tests") == 2  # as the settlement drain writes them
    assert sorted(rows()) == ["credited", "duplicate", "in_flight"]
    with db.connection_context():
        kept = WebhookCall.get(WebhookCall.verdict == "duplicate")
        first_row = WebhookCall.get(WebhookCall.verdict == "credited")
    # the body is kept once (the credited row); a repeat's row keeps its length and hash
    assert (bytes(kept.body), kept.reference, kept.status_code) == (b"", "rt-pay-1", 200)
    assert bytes(first_row.body) == raw and kept.body_length == len(raw)
    assert kept.body_sha256 == delivery.sha256 and kept.headers == delivery.headers

    # a further repeat of the same bytes: its (verdict, body) row is written, nothing is queued
    again, trips = _counted_trips(lambda: gate.enter(store, store, q, note, delivery, claim_ttl_ms=30_000))
    assert (again.verdict, trips) == ("duplicate", 1)
    assert store.redis.llen(keys.WEBHOOK_CALLS_PENDING) == 0
    # the same payment in other bytes is a row of its own
    other = ledger.receipt("paystack", raw.replace(b"{", b"{ ", 1), {"content-type": "application/json"})
    assert gate.enter(store, store, q, note, other, claim_ttl_ms=30_000).verdict == "duplicate"
    assert store.redis.llen(keys.WEBHOOK_CALLS_PENDING) == 1


def test_a_burst_of_repeats_queues_one_audit_row_per_body_and_verdict_on_a_queue_apart(redis_server):
    """With the queue on a Redis of its own (as on a cluster), the gate's reply says whether
    the row must be queued: once per body and verdict. A row lost because both the queue and
    the database were down is forgotten by the gate, so the next repeat queues it again."""
    from testkit.payments import encode, payload
    from webhooks.payments import gate, ledger
    from webhooks.payments.providers import notifications
    from webhooks.storage.live import keys
    from webhooks.storage.live.redis import make_store
    from webhooks.storage.live.scripts import PaymentRef
    from webhooks.storage.live.settle_queue import queue as rq_queue
    from webhooks.storage.records.db import make_database

    base = redis_server.url.rsplit("/", 1)[0]
    store, apart = make_store(base + "/9"), make_store(base + "/10")
    store.redis.flushdb()
    apart.redis.flushdb()
    q = rq_queue(apart.redis)
    raw = encode(payload("paystack", "apart-1", 5000))
    note = notifications.parse("paystack", raw)
    delivery = ledger.receipt("paystack", raw, {})

    def pending() -> int:
        return apart.redis.llen(keys.WEBHOOK_CALLS_PENDING)

    held = gate.enter(store, apart, q, note, delivery, claim_ttl_ms=30_000)
    assert held.verdict == "claimed" and pending() == 0
    for _ in range(5):
        assert gate.enter(store, apart, q, note, delivery, claim_ttl_ms=30_000).verdict == "in_flight"
    assert pending() == 1
    gate.finish(store, note, held.claim, processed=True)
    for _ in range(5):
        assert gate.enter(store, apart, q, note, delivery, claim_ttl_ms=30_000).verdict == "duplicate"
    assert pending() == 2
    assert ttl_s(store, PaymentRef("paystack", "apart-1").audited) <= gate.AUDITED_TTL_MS // 1000

    # a new body under a verdict met before: queue and database both down, the row is lost
    dead_queue = make_store("redis://127.0.0.1:1/0")
    other = ledger.receipt("paystack", raw.replace(b"{", b"{ ", 1), {})
    original = db.obj
    db.initialize(make_database("mysql://root@127.0.0.1:1/unreachable"))
    try:
        lost = gate.enter(store, dead_queue, rq_queue(dead_queue.redis), note, other, claim_ttl_ms=30_000)
    finally:
        db.initialize(original)
    assert lost.verdict == "duplicate"
    assert not store.redis.sismember(PaymentRef("paystack", "apart-1").audited, f"duplicate:{other.sha256}")
    # ... and the next repeat of those bytes queues it
    assert gate.enter(store, apart, q, note, other, claim_ttl_ms=30_000).verdict == "duplicate"
    assert pending() == 3


def ttl_s(store: Store, key: str) -> int:
    ttl = store.redis.ttl(key)
    assert ttl > 0, f"{key} must expire"
    return ttl


def _receive(intake: Intake, api_key: str, lead: dict) -> tuple[str | Exception, int]:
    """A lead posted through `Intake.receive` (authentication and the publisher's token bucket
    included): its answer, or the error it raised; and the round trips it cost."""
    with db.connection_context():
        snapshot = load_snapshot("test")
    request = LeadRequest(
        authorization=f"Bearer {api_key}",
        body=lambda: dict(lead),
        text=lambda: json.dumps(lead),
        received_at=datetime.now(timezone.utc),
        request_id=None,
    )
    me = threading.get_ident()
    before = SENT[me]
    WHAT[me] = []
    try:
        answer: str | Exception = intake.receive(snapshot, request).text
    except (RateLimited, ValidationError) as exc:
        answer = exc
    return answer, SENT[me] - before


def _tokens(r: redis.Redis, publisher_id: str) -> float:
    return int(r.hget(keys.rate_bucket(publisher_id), "tokens")) / 1_000_000


def test_once_its_bucket_is_seen_a_limited_lead_takes_its_token_with_its_claim(
    api, buyer_server, counted, redis_server
):
    buyer_server.add("acme")
    key = api.put_publisher("surge", rate_limit={"per_second": 1, "burst": 100})
    api.put_buyer("acme", buyer_server.url("acme"))
    r = redis_server.client()
    answer, trips = _receive(counted, key, {"lead_id": "tk-1"})
    assert '"status": "sold"' in answer and trips == 3  # the token on its own: not seen before
    for i in range(2, 12):
        answer, trips = _receive(counted, key, {"lead_id": f"tk-{i}"})
        assert '"status": "sold"' in answer
        assert trips == 2, WHAT[threading.get_ident()]  # the token went with the claim
    assert 89 <= _tokens(r, "surge") < 90  # one token a lead, whichever way (refilled: under a second)


def test_a_token_the_claim_does_not_find_refuses_the_lead_and_frees_the_buyers_slot(
    api, buyer_server, counted, redis_server
):
    """Other processes took the last tokens since this one saw the bucket: the claim refuses
    the lead as the token's own round trip would have, and the first buyer's reservation made
    beside it is given back."""
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge", rate_limit={"per_second": 1, "burst": 100})
    api.put_buyer("acme", buyer_server.url("acme"), caps={"daily": 5})
    r = redis_server.client()
    assert '"status": "sold"' in _receive(counted, key, {"lead_id": "gone-1"})[0]
    seconds, micros = r.time()
    r.hset(keys.rate_bucket("surge"), mapping={"tokens": 0, "at": seconds * 1_000_000 + micros})
    refused, trips = _receive(counted, key, {"lead_id": "gone-2"})
    assert isinstance(refused, RateLimited) and refused.retry_after_s == 1
    assert trips == 2  # the claim with the reservation, then its withdrawal
    assert not r.exists(keys.lead_claim("surge", "gone-2")) and not r.exists(keys.lead_attempt("surge", "gone-2"))
    # the slot given back: the sale's count only (the run's RQ worker may be settling that
    # sale meanwhile, so its lease is not compared)
    assert api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == 1
    assert len(acme.received) == 1
    # seen empty now: the next lead's token is asked for on its own, before anything else
    again, trips = _receive(counted, key, {"lead_id": "gone-3"})
    assert isinstance(again, RateLimited) and trips == 1


def test_a_lead_that_ends_before_its_claim_still_takes_its_token(api, buyer_server, counted, redis_server):
    """A lead refused for its body, or suppressed, never reaches its claim: its token is taken
    then, and an empty bucket answers 429 as it would have first."""
    buyer_server.add("acme")
    key = api.put_publisher("surge", rate_limit={"per_second": 1, "burst": 100})
    api.put_buyer("acme", buyer_server.url("acme"))
    r = redis_server.client()
    assert '"status": "sold"' in _receive(counted, key, {"lead_id": "e-1"})[0]
    before = _tokens(r, "surge")
    invalid, trips = _receive(counted, key, {"lead_id": "e 2"})
    assert isinstance(invalid, ValidationError) and trips == 1
    assert before - 1 <= _tokens(r, "surge") < before  # its token, taken on its own
    seconds, micros = r.time()
    r.hset(keys.rate_bucket("surge"), mapping={"tokens": 0, "at": seconds * 1_000_000 + micros})
    counted.buckets.saw("surge", 50)  # as if another process had left it full
    refused, _ = _receive(counted, key, {"lead_id": "e 3"})
    assert isinstance(refused, RateLimited)
