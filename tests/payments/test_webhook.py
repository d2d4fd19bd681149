"""POST /v1/webhooks/<provider> against the real app (gunicorn + gevent, Redis, MySQL)."""

from __future__ import annotations

import time

import pytest

from testkit.payments import PROVIDERS, balance, counts, deliver, encode, payload, signed_headers, verdicts
from testkit.servers import WebServer
from webhooks import services
from webhooks.storage.live import keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog


@pytest.mark.parametrize("provider", PROVIDERS)
def test_signed_webhook_call_credits_once_then_answers_duplicate(api, provider):
    raw = encode(payload(provider, f"{provider}-ref-1", 250050, "NGN", "Ada@Example.com"))
    first = deliver(api, provider, raw)
    assert (first.status_code, first.json()) == (200, {"status": "credited"})
    again = deliver(api, provider, raw)
    assert (again.status_code, again.json()) == (200, {"status": "duplicate"})
    assert balance("ada@example.com", "NGN") == 250050
    assert verdicts(provider) == ["credited", "duplicate"]


def test_failed_charge_is_recorded_and_ignored(api):
    raw = encode(payload("paystack", "ps-failed", 5000, success=False))
    resp = deliver(api, "paystack", raw)
    assert (resp.status_code, resp.json()) == (200, {"status": "ignored", "reason": "event_type"})
    assert counts() == {"payments": 0, "wallets": 0, "deliveries": 1}
    assert verdicts("paystack", "ps-failed") == ["ignored"]


def forgeries(provider: str, raw: bytes) -> dict[str, tuple[bytes, dict]]:
    genuine = signed_headers(provider, raw)
    cases = {
        "tampered body": (raw.replace(b"ada@", b"eve@"), genuine),
        "wrong secret": (raw, signed_headers(provider, raw, secret="whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ==")),
        "missing header": (raw, {}),
    }
    if provider == "flutterwave":
        del cases["tampered body"]  # verif-hash signs nothing; only the secret hash is checked
    if provider in ("stripe", "standard"):
        cases["stale timestamp"] = (raw, signed_headers(provider, raw, at=time.time() - 301))
    return cases


@pytest.mark.parametrize("provider", PROVIDERS)
def test_forged_webhook_calls_get_401_and_no_row(api, provider):
    """No row at all: they are listed in Redis only (tests/payments/test_rejected.py)."""
    raw = encode(payload(provider, f"{provider}-forged", 100000))
    cases = forgeries(provider, raw)
    for what, (body, headers) in cases.items():
        resp = deliver(api, provider, body, headers=headers)
        assert resp.status_code == 401, what
        assert resp.json()["error"]["code"] == "invalid_signature", what
    assert counts() == {"payments": 0, "wallets": 0, "deliveries": 0}
    assert services.of(api.app).store.redis.llen(keys.REJECTED_WEBHOOKS) == len(cases)


def test_flutterwave_secret_hash_is_not_stored_with_the_webhook_call(api):
    raw = encode(payload("flutterwave", "flw-audit", 100))
    deliver(api, "flutterwave", raw)
    with db.connection_context():
        stored = db.execute_sql("SELECT headers FROM webhook_calls").fetchone()[0]
    assert "flw-secret-hash" not in stored and "<redacted>" in stored


def test_signed_garbage_is_invalid_payload(api):
    raw = b'{"event": "charge.success", "data": {"amount": 100}}'
    resp = deliver(api, "paystack", raw)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_payload"
    assert counts() == {"payments": 0, "wallets": 0, "deliveries": 1}
    assert verdicts("paystack") == ["invalid_payload"]


def test_unknown_provider_is_404_json(api):
    resp = api.http.post(f"{api.base}/v1/webhooks/paypal", data=b"{}")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


@pytest.mark.e2e  # a gunicorn of its own
def test_provider_without_a_secret_answers_provider_not_configured(base_env, tmp_root):
    env = {k: v for k, v in base_env.items() if k != "MONNIFY_CLIENT_SECRET"}
    server = WebServer(env, tmp_root / "web-nomonnify.log", workers=1)
    try:
        raw = encode(payload("monnify", "mnfy-1", 100))
        resp = deliver(server.url, "monnify", raw)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "provider_not_configured"
        assert counts()["deliveries"] == 0
    finally:
        server.stop()


def test_conflicting_reference_gets_422_credits_nothing_and_is_audited(api):
    deliver(api, "paystack", encode(payload("paystack", "ps-conflict", 10000)))
    for other in ({"amount_minor": 99999}, {"currency": "USD"}, {"email": "mallory@example.com"}):
        args = {"amount_minor": 10000, "currency": "NGN", "email": "ada@example.com", **other}
        resp = deliver(api, "paystack", encode(payload("paystack", "ps-conflict", **args)))
        assert resp.status_code == 422, other
        assert resp.json()["error"]["code"] == "reference_conflict"
    assert balance("ada@example.com", "NGN") == 10000
    assert balance("ada@example.com", "USD") is None and balance("mallory@example.com", "NGN") is None
    assert counts()["payments"] == 1
    with db.connection_context():
        flagged = list(AuditLog.select().where(AuditLog.action == "payment.reference_conflict"))
    assert [a.entity_id for a in flagged] == ["paystack:ps-conflict"] * 3
    assert verdicts("paystack") == ["credited"] + ["reference_conflict"] * 3
    same = deliver(api, "paystack", encode(payload("paystack", "ps-conflict", 10000)))
    assert same.json() == {"status": "duplicate"}


def test_admin_reads_wallet_balances_and_payment_rows(api):
    deliver(api, "paystack", encode(payload("paystack", "ps-a", 1250000, "NGN", "ADA@example.com")))
    deliver(api, "stripe", encode(payload("stripe", "pi_a", 500, "USD", "ada@example.com")))
    deliver(api, "monnify", encode(payload("monnify", "MNFY|1|2", 1000, "NGN", "ada@example.com")))
    wallet = api.get("/v1/admin/wallets/Ada@Example.com")
    assert wallet.status_code == 200
    assert wallet.json() == {"customer": "ada@example.com", "balances_minor": {"NGN": 1251000, "USD": 500}}
    row = api.get("/v1/admin/payments/monnify/MNFY%7C1%7C2").json()
    assert {k: row[k] for k in ("amount_minor", "currency", "customer", "status")} == {
        "amount_minor": 1000,
        "currency": "NGN",
        "customer": "ada@example.com",
        "status": "credited",
    }
    assert row["received_at"].endswith("Z") and row["credited_at"].endswith("Z")
    assert api.get("/v1/admin/wallets/nobody@example.com").status_code == 404
    assert api.get("/v1/admin/payments/stripe/pi_unknown").status_code == 404
    assert api.get("/v1/admin/payments/paypal/pi_a").status_code == 404
    assert api.http.get(api.base + "/v1/admin/wallets/ada@example.com").status_code == 401


def test_an_audit_row_the_database_refuses_is_parked_and_the_others_written(api, queue_server):
    """The drain writes queued audit rows in batches; one it cannot write is set aside in
    fg:deliveries:failed (with a log line) rather than failing the job that settles leads."""
    from webhooks.storage.live import keys

    raw = encode(payload("paystack", "ps-parked", 2500))
    assert deliver(api, "paystack", raw).json() == {"status": "credited"}
    assert deliver(api, "paystack", raw).json() == {"status": "duplicate"}  # its row is queued
    r = queue_server.client()  # the queue's Redis (a Redis of its own beside a cluster)
    bad = '{"verdict":"duplicate","status_code":200,"provider":"paystack","body":"%%%not base64"}'
    r.lpush(keys.WEBHOOK_CALLS_PENDING, bad)
    assert verdicts("paystack", "ps-parked") == ["credited", "duplicate"]  # the drain's own code wrote it
    assert r.lrange(keys.WEBHOOK_CALLS_FAILED, 0, -1) == [bad]
    assert r.llen(keys.WEBHOOK_CALLS_PENDING) == 0
