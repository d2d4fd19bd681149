"""Exactly-once under real concurrency: many threads, several gunicorn processes, one ledger."""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from testkit.payments import PROVIDERS, balance, counts, deliver, encode, payload
from testkit.servers import WebServer
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Payment, Wallet


@pytest.fixture(scope="module")
def second_web(base_env, tmp_root):
    """Another gunicorn (2 more worker processes) on the same Redis and database."""
    server = WebServer(base_env, tmp_root / "web-payments-2.log", workers=2)
    yield server
    server.stop()


def test_same_payment_50_times_at_once_across_processes_credits_once(web_api, second_web):
    api = web_api
    raw = encode(payload("paystack", "ps-burst", 777700, "NGN", "burst@example.com"))
    bases = [api.base, second_web.url]
    start = threading.Barrier(50)

    def one(i: int) -> tuple[int, dict]:
        start.wait()
        resp = deliver(bases[i % 2], "paystack", raw)
        return resp.status_code, resp.json()

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(one, range(50)))
    statuses = Counter(body["status"] for _code, body in answers)
    assert all(code in (200, 409) for code, _ in answers), answers
    assert statuses["credited"] == 1
    assert set(statuses) <= {"credited", "duplicate", "in_flight"}
    assert all(code == 409 for code, body in answers if body["status"] == "in_flight")
    assert balance("burst@example.com", "NGN") == 777700
    found = counts()
    assert (found["payments"], found["wallets"]) == (1, 1)
    # one audit row per verdict the body met, however many times it came (gate.write_rows)
    assert 1 <= found["deliveries"] <= len(statuses)


def test_thousand_payments_sent_five_times_shuffled_credit_each_exactly_once(web_api, second_web):
    api = web_api
    rng = random.Random(4)
    customers = [f"payer{i}@example.com" for i in range(40)]
    payments, expected = [], defaultdict(int)
    for n in range(1000):
        provider = PROVIDERS[n % len(PROVIDERS)]
        currency = rng.choice(["NGN", "USD", "GHS", "JPY"])
        customer, amount = rng.choice(customers), rng.randint(1, 5_000_000)
        payments.append((provider, encode(payload(provider, f"bulk-{n}", amount, currency, customer))))
        expected[(customer, currency)] += amount
    deliveries = [(i, p) for i, p in enumerate(payments) for _ in range(5)]
    rng.shuffle(deliveries)
    bases = [api.base, second_web.url]
    local = threading.local()

    def one(item) -> tuple[int, int, str]:
        i, (provider, raw) = item
        if not hasattr(local, "session"):
            local.session = requests.Session()
        resp = deliver(bases[i % 2], provider, raw, session=local.session)
        return i, resp.status_code, resp.json().get("status", resp.text)

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(one, deliveries))

    assert [a for a in answers if a[1] not in (200, 409)] == []
    credited = Counter(i for i, _code, status in answers if status == "credited")
    assert len(credited) == 1000 and set(credited.values()) == {1}
    with db.connection_context():
        assert Payment.select().count() == 1000
        wallets = {(w.customer, w.currency): w.balance_minor for w in Wallet.select()}
    assert wallets == dict(expected)


def test_the_worker_writes_the_queued_audit_rows_of_repeats(web_api, worker, redis_server):
    """Repeats answer without the database; the settlement drain writes their rows in a batch,
    each with the verdict it was answered, one row per body and verdict (a replay of the same
    bytes is not written again; a delivery of other bytes is)."""
    from testkit.servers import wait_until
    from webhooks.storage.records.models import WebhookCall

    raw = encode(payload("flutterwave", "flw-repeats", 12300, "NGN", "repeats@example.com"))
    answers = [deliver(web_api, "flutterwave", raw).json()["status"] for _ in range(6)]
    assert answers == ["credited"] + ["duplicate"] * 5

    def written() -> list[str]:
        with db.connection_context():
            return [
                d.verdict
                for d in WebhookCall.select()
                .where(WebhookCall.reference == "flw-repeats")
                .order_by(WebhookCall.received_at)
            ]

    other_bytes = raw.replace(b"{", b"{ ", 1)  # the same payment, delivered again in other bytes: queued last
    assert deliver(web_api, "flutterwave", other_bytes).json()["status"] == "duplicate"
    wait_until(lambda: len(written()) == 3, timeout=20, what="the worker to write the queued rows")
    assert written() == ["credited", "duplicate", "duplicate"]


def test_a_batch_of_repeats_reads_its_references_rows_not_the_whole_table(database_url):
    """The settlement drain writes queued audit rows (gate.write_rows) after reading the rows
    already kept for their (provider, reference): on the index, so what one batch reads does not
    grow with webhook_calls (a lookup by reference alone cannot use the (provider, reference)
    index: MariaDB read the whole table for every batch)."""
    from datetime import datetime, timezone

    from testkit.reads import rows_read
    from webhooks.payments import gate, ledger
    from webhooks.payments.providers import notifications
    from webhooks.storage.records.db import is_mysql
    from webhooks.storage.records.models import WebhookCall

    if not is_mysql():
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306): counts the rows the server reads")
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    others = [
        dict(provider="paystack", reference=f"scan-other-{i}", verdict="credited", status_code=200, headers="{}",
             body=b"{}", received_at=now, body_sha256=f"{i:064x}")
        for i in range(3000)
    ]  # fmt: skip
    raws = []
    for i in range(20):
        raw = encode(payload("paystack", f"scan-repeat-{i}", 5000))
        note = notifications.parse("paystack", raw)
        raws.append(gate._with_verdict("duplicate", gate.audit_row(ledger.receipt("paystack", raw, {}), note)))

    with db.connection_context():
        for i in range(0, len(others), 500):
            WebhookCall.insert_many(others[i : i + 500]).execute()
        assert rows_read(lambda: gate.write_rows(raws)) < 100  # 3,000 and more when it scans
        assert rows_read(lambda: gate.write_rows(raws)) < 100  # the repeats found: none written again
        assert WebhookCall.select().where(WebhookCall.reference.startswith("scan-repeat-")).count() == 20


def test_200_replays_of_a_webhook_call_store_its_body_once(api):
    """Paystack's scheme has no timestamp: a captured delivery can be replayed for ever. Each
    replay is answered `duplicate` (and counted), but the database keeps the body once and one
    row per verdict, however many replays come."""
    from testkit.payments import verdicts, with_metadata, write_queued_deliveries
    from webhooks.storage.records.models import WebhookCall

    notes = {"notes": "n" * 60_000}  # a big delivery: under the 64 KiB kept of a body
    raw = encode(with_metadata("paystack", payload("paystack", "ps-replayed", 40000), notes))

    def stored() -> tuple[int, int]:
        write_queued_deliveries()
        with db.connection_context():
            rows = WebhookCall.select().where(WebhookCall.reference == "ps-replayed")
            return rows.count(), sum(len(r.body) for r in rows)

    assert [deliver(api, "paystack", raw).json()["status"] for _ in range(2)] == ["credited", "duplicate"]
    after_one = stored()
    assert after_one == (2, len(raw))  # the repeat's row: its length and hash, not its body again
    for _ in range(199):
        assert deliver(api, "paystack", raw).json() == {"status": "duplicate"}
    assert stored() == after_one
    assert verdicts("paystack", "ps-replayed") == ["credited", "duplicate"]
    assert balance("ada@example.com", "NGN") == 40000
