"""Failures that must not lose or double a payment: Redis down, the database refusing the
transaction, the claim holder killed mid-request. All real: no mocks."""

from __future__ import annotations

import os
import signal
import threading
from urllib.parse import urlparse

import peewee
import pymysql
import pytest
import requests

from testkit.payments import at_once, balance, child_pids, counts, deliver, encode, payload, verdicts
from testkit.servers import WebServer, free_port, wait_until
from webhooks.storage.live import keys
from webhooks.storage.records.db import DEADLOCK, db, error_code


@pytest.fixture
def mysql(database_url):
    if not database_url.startswith("mysql://"):
        pytest.skip("needs MySQL/MariaDB (locks, triggers)")
    p = urlparse(database_url)
    return dict(
        host=p.hostname,
        port=p.port or 3306,
        user=p.username or "root",
        password=p.password or "",
        database=p.path.lstrip("/"),
        autocommit=True,
    )


def test_redis_down_answers_503_records_nothing_and_the_retry_credits(api, redis_server):
    raw = encode(payload("stripe", "pi_redis_down", 4200, "USD", "ada@example.com"))
    redis_server.kill()
    try:
        resp = deliver(api, "stripe", raw)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "unavailable"
        assert counts() == {"payments": 0, "wallets": 0, "deliveries": 0}
    finally:
        redis_server.start()
    answers = []
    for _ in range(5):  # the provider retries; the first may meet a pooled connection to the old Redis
        answers.append(deliver(api, "stripe", raw))
        if answers[-1].status_code != 503:
            break
    assert answers[-1].json() == {"status": "credited"}
    assert balance("ada@example.com", "USD") == 4200
    assert deliver(api, "stripe", raw).json() == {"status": "duplicate"}


def test_database_refusing_after_the_claim_gets_5xx_then_the_retry_credits_once(api, mysql, redis_server):
    raw = encode(payload("monnify", "MNFY|refused|1", 150000, "NGN", "refused@example.com"))
    conn = pymysql.connect(**mysql)
    with conn.cursor() as c:  # the wallet write fails after the payment row went in
        c.execute(
            "CREATE TRIGGER fg_test_refuse_wallet BEFORE INSERT ON wallets FOR EACH ROW "
            "BEGIN IF NEW.customer = 'refused@example.com' THEN "
            "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'wallet writes refused'; END IF; END"
        )
    try:
        resp = deliver(api, "monnify", raw)
        assert resp.status_code >= 500 and resp.json()["error"]["code"] == "unavailable"
        assert counts() == {"payments": 0, "wallets": 0, "deliveries": 0}
        r = redis_server.client()
        assert r.exists(keys.payment("monnify", "MNFY|refused|1", "claim")) == 0  # released
        assert r.exists(keys.payment("monnify", "MNFY|refused|1", "processed")) == 0
    finally:
        with conn.cursor() as c:
            c.execute("DROP TRIGGER IF EXISTS fg_test_refuse_wallet")
        conn.close()
    assert deliver(api, "monnify", raw).json() == {"status": "credited"}
    assert deliver(api, "monnify", raw).json() == {"status": "duplicate"}
    assert balance("refused@example.com", "NGN") == 150000
    assert counts()["payments"] == 1


def test_no_free_database_connection_answers_503_and_the_retry_credits(api, mysql, redis_server):
    """Every pooled connection is busy for longer than the pool waits: the delivery is told
    503 `unavailable` (retry), not 500, and nothing is half-written."""
    raw = encode(payload("paystack", "ps-pool-full", 7000, "NGN", "pool@example.com"))
    pool = db.obj
    held, release = [], threading.Event()

    def hold() -> None:
        db.connect(reuse_if_open=True)
        held.append(1)
        release.wait(30)
        db.close()

    holders = [threading.Thread(target=hold) for _ in range(pool._max_connections)]
    wait, pool._wait_timeout = pool._wait_timeout, 0.2  # not the deployed 10 s
    try:
        for t in holders:
            t.start()
        wait_until(lambda: len(held) == len(holders), what="every pooled connection held")
        resp = deliver(api, "paystack", raw)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "unavailable"
    finally:
        release.set()
        for t in holders:
            t.join(10)
        pool._wait_timeout = wait
    assert redis_server.client().exists(keys.payment("paystack", "ps-pool-full", "claim")) == 0
    assert counts() == {"payments": 0, "wallets": 0, "deliveries": 0}
    assert deliver(api, "paystack", raw).json() == {"status": "credited"}
    assert balance("pool@example.com", "NGN") == 7000


@pytest.mark.e2e  # a gunicorn of its own
def test_database_unreachable_answers_503_releases_the_claim_and_the_retry_credits(
    api, base_env, tmp_root, redis_server
):
    dead = f"mysql://root@127.0.0.1:{free_port()}/floodgate"  # nothing listens there
    server = WebServer({**base_env, "DATABASE_URL": dead}, tmp_root / "web-nodb.log", workers=1)
    raw = encode(payload("interswitch", "ISW-nodb", 990000, "NGN", "ada@example.com"))
    try:
        resp = deliver(server.url, "interswitch", raw)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "unavailable"
    finally:
        server.stop()
    r = redis_server.client()
    assert r.exists(keys.payment("interswitch", "ISW-nodb", "claim")) == 0
    assert counts() == {"payments": 0, "wallets": 0, "deliveries": 0}
    assert deliver(api, "interswitch", raw).json() == {"status": "credited"}
    assert balance("ada@example.com", "NGN") == 990000


def _lock_waits(mysql: dict) -> int:
    conn = pymysql.connect(**mysql)
    try:
        with conn.cursor() as c:
            c.execute("SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'")
            return c.fetchone()[0]
    finally:
        conn.close()


@pytest.mark.e2e  # kill -9 of a gunicorn worker
def test_a_killed_worker_s_credit_commits_once_and_its_retries_are_duplicates(base_env, tmp_root, mysql, redis_server):
    server = WebServer({**base_env, "PAYMENT_CLAIM_TTL_MS": "3000"}, tmp_root / "web-kill.log", workers=1)
    holder = pymysql.connect(**{**mysql, "autocommit": False})
    try:
        customer = "victim@example.com"
        seed = encode(payload("paystack", "ps-seed", 100, "NGN", customer))
        assert deliver(server.url, "paystack", seed).json() == {"status": "credited"}
        raw = encode(payload("paystack", "ps-killed", 5000, "NGN", customer))

        with holder.cursor() as c:  # hold the wallet row: the request hangs inside its transaction
            c.execute("SELECT balance_minor FROM wallets WHERE customer = %s FOR UPDATE", (customer,))
        outcome = {}

        def first_delivery():
            try:
                outcome["response"] = deliver(server.url, "paystack", raw)
            except requests.RequestException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=first_delivery)
        thread.start()
        wait_until(lambda: _lock_waits(mysql) > 0, timeout=10, what="the delivery to wait on the wallet lock")
        [worker] = child_pids(server.pid)
        os.kill(worker, signal.SIGKILL)
        thread.join(10)
        assert "error" in outcome, outcome  # the provider got no answer

        claim = keys.payment("paystack", "ps-killed", "claim")
        assert redis_server.client().pttl(claim) > 0  # still held by the dead worker...
        assert deliver(server.url, "paystack", raw).status_code == 409  # ...so a retry must wait
        # The dead worker's transaction went to the server whole, its COMMIT included (one round
        # trip): once the lock is free the server finishes it, as it would a commit whose reply
        # was lost. The wallet moves once; the provider, answered nothing, retries.
        holder.rollback()
        wait_until(lambda: balance(customer, "NGN") == 5100, timeout=10, what="the sent credit to commit")
        wait_until(lambda: redis_server.client().exists(claim) == 0, timeout=10, what="the claim to expire")

        assert deliver(server.url, "paystack", raw).json() == {"status": "duplicate"}
        assert deliver(server.url, "paystack", raw).json() == {"status": "duplicate"}
        assert balance(customer, "NGN") == 5100
        assert verdicts("paystack", "ps-killed") == ["credited", "in_flight", "duplicate"]
    finally:
        holder.close()
        server.stop()


def test_innodb_deadlock_is_recognised_for_retry(mysql):
    """credit() retries deadlocks; check the error peewee raises for a real one is recognised."""
    with db.connection_context():
        db.execute_sql(
            "INSERT INTO wallets (customer, currency, balance_minor, updated_at) VALUES "
            "('a@x.io', 'NGN', 0, NOW(6)), ('b@x.io', 'NGN', 0, NOW(6))"
        )
    barrier, errors = threading.Barrier(2), []

    def cross(first: str, second: str) -> None:
        try:
            with db.connection_context(), db.atomic():
                db.execute_sql("UPDATE wallets SET balance_minor = 1 WHERE customer = %s", (first,))
                barrier.wait()
                db.execute_sql("UPDATE wallets SET balance_minor = 2 WHERE customer = %s", (second,))
        except peewee.OperationalError as exc:
            errors.append(exc)

    pairs = (("a@x.io", "b@x.io"), ("b@x.io", "a@x.io"))
    threads = [threading.Thread(target=cross, args=pair) for pair in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(errors) == 1 and error_code(errors[0]) == DEADLOCK


def test_a_credit_announces_the_balance_after_it_new_positive_or_below_zero_wallet(api, redis_server):
    """The upsert hands the balance back (MySQL: LAST_INSERT_ID, an unsigned 64-bit value):
    a new wallet, a wallet in credit and one a refund took below zero all read right."""
    import json

    from webhooks.storage.records.models import Event, Wallet

    def credited(reference: str, amount: int) -> int:
        resp = deliver(api, "standard", encode(payload("standard", reference, amount, "NGN", "low@example.com")))
        assert resp.json() == {"status": "credited"}, resp.text
        with db.connection_context():
            event = Event.select().where(Event.subject == f"standard:{reference}").get()
        return json.loads(event.body)["data"]["balance_minor"]

    assert credited("std-bal-1", 1_000) == 1_000  # a new wallet
    assert credited("std-bal-2", 250) == 1_250  # one in credit
    with db.connection_context():
        Wallet.update(balance_minor=-5_000).where(Wallet.customer == "low@example.com").execute()
    assert credited("std-bal-3", 300) == -4_700  # one below zero
    assert credited("std-bal-4", 10**12) == 10**12 - 4_700
    assert balance("low@example.com", "NGN") == 10**12 - 4_700


def test_credits_to_one_wallet_at_once_announce_the_balances_in_their_order(api, redis_server):
    """Each credit's event reads its wallet's balance in the credit's own transaction, under the
    row lock of its upsert: 24 credits at once to one wallet announce 24 distinct balances, each
    the one before it plus its amount, in the order of the events' ids (the order sent)."""
    import json

    from webhooks.storage.records.models import Event

    amounts = [100 * (i + 1) for i in range(24)]
    bodies = [encode(payload("standard", f"std-race-{i}", a, "NGN", "race@example.com")) for i, a in enumerate(amounts)]
    answers = at_once(api, "standard", bodies)
    assert [a["status"] for a in answers] == ["credited"] * 24
    with db.connection_context():
        events = list(Event.select().where(Event.entity == "race@example.com").order_by(Event.id))
    seen = [json.loads(e.body)["data"] for e in events]
    running = 0
    for data in seen:
        running += data["amount_minor"]
        assert data["balance_minor"] == running
    assert sorted(d["amount_minor"] for d in seen) == amounts
    assert balance("race@example.com", "NGN") == sum(amounts)
