"""Store's script calls (webhooks/storage/live/redis.py `Store._run`) against a Redis that does not
know the scripts: restarted empty, failed over to a replica that never loaded them, flushed."""

from __future__ import annotations

from webhooks.storage.live.redis import make_store
from webhooks.storage.live.scripts import PaymentRef


def test_a_redis_that_forgot_the_scripts_runs_them_all_the_same(redis_server):
    store = make_store(redis_server.url)
    ref = PaymentRef("paystack", "noscript-1")
    store.redis.delete(ref.marker, ref.claim, ref.audited)
    store.redis.script_flush()
    sha = store.scripts["payment_gate"].sha
    assert store.redis.script_exists(sha) == [False]
    first = store.payment_gate(ref, "fp", "token-1", 30_000, body_sha256="a" * 64, audited_ttl_ms=60_000)
    assert first.verdict == "claimed"
    assert store.redis.script_exists(sha) == [True]  # loaded again, for the next calls
    assert (
        store.payment_gate(ref, "fp", "token-2", 30_000, body_sha256="a" * 64, audited_ttl_ms=60_000).verdict
        == "in_flight"
    )
