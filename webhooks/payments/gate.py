"""The Redis front of a payment (or refund) notification: one round trip says whether it repeats
what was already credited (a duplicate), whether another request holds its reference (in
flight), or claims the reference for this request; the two answers that change nothing queue
their audit row in Redis, once per body and verdict (`write_rows` writes them in batches), and
never wait for the database. `finish` marks the reference processed and releases the claim.
docs/payments.md "Flow", steps 4 to 6."""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import peewee as pw
from redis.cluster import RedisCluster
from rq import Queue

from webhooks.payments import ledger
from webhooks.payments.ledger import Receipt
from webhooks.payments.providers.notifications import PaymentNotification, RefundNotification
from webhooks.storage.live import claims, keys, settle_queue
from webhooks.storage.live.redis import REDIS_DOWN, Store
from webhooks.storage.live.scripts import PaymentRef
from webhooks.storage.records import fastsql
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, db
from webhooks.storage.records.models import WebhookCall
from webhooks.storage.states import GateVerdict

log = logging.getLogger(__name__)

PROCESSED_TTL_S = 7 * 24 * 3600
# How long the gate remembers which (verdict, body) audit rows it handed over, so that a burst
# of repeats queues one row, not one per repeat; after it `write_rows` drops the repeat's row.
AUDITED_TTL_MS = 3600 * 1000
CLAIMED, DUPLICATE, IN_FLIGHT = GateVerdict.CLAIMED, GateVerdict.DUPLICATE, GateVerdict.IN_FLIGHT
STATUS = {DUPLICATE: 200, IN_FLIGHT: 409}


def _ref(note: PaymentNotification | RefundNotification) -> PaymentRef:
    """A payment's or a refund's reference (refunds have a key space of their own)."""
    assert note.reference is not None  # only refunds and succeeded payments (parse() wants one) get here
    return PaymentRef(note.provider, note.reference, isinstance(note, RefundNotification))


def claim_key(note: PaymentNotification | RefundNotification) -> str:
    """The key a request claims while it credits the payment (or debits the refund)."""
    return _ref(note).claim


@dataclass(frozen=True)
class Entry:
    verdict: GateVerdict
    claim: claims.Claim | None  # ours, when claimed


def enter(
    store: Store,
    queue_redis: Store,
    queue: Queue,
    note: PaymentNotification | RefundNotification,
    d: Receipt,
    *,
    claim_ttl_ms: int,
    request_id: str | None = None,
) -> Entry:
    """Dedupe and claim `note` in one round trip (lua/payment_gate.lua); a duplicate or
    in-flight webhook call's audit row is queued, not written, once per body and verdict."""
    token = claims.new_token()
    ref = _ref(note)
    if queue_redis is store and not isinstance(store.redis, RedisCluster):
        verdict, enqueue, _ = store.payment_gate(
            ref,
            note.fingerprint,
            token,
            claim_ttl_ms,
            body_sha256=d.sha256,
            audited_ttl_ms=AUDITED_TTL_MS,
            audit_row=audit_row(d, note)[1:],
        )
        if enqueue:
            try:
                settle_queue.enqueue_drain(queue, request_id=request_id)
            except REDIS_DOWN as exc:  # the row is queued: the scheduler's drain (every minute) takes it
                log.warning("audit row queued, drain job not enqueued: %s", exc)
    else:
        verdict, _, queue_row = store.payment_gate(
            ref, note.fingerprint, token, claim_ttl_ms, body_sha256=d.sha256, audited_ttl_ms=AUDITED_TTL_MS
        )
        if queue_row:  # the row is built only now: the script says whether it is wanted
            raw = _with_verdict(verdict, audit_row(d, note))
            _queue_apart(
                store, queue_redis, queue, ref, audited=f"{verdict}:{d.sha256}", raw=raw, request_id=request_id
            )
    return Entry(verdict, claims.Claim(ref.claim, token) if verdict == CLAIMED else None)


def finish(store: Store, note: PaymentNotification | RefundNotification, claim: claims.Claim, processed: bool) -> None:
    """Release our claim, and with `processed` (the transaction committed a change or found
    it committed) set the marker that makes the next repeat a duplicate. If Redis is gone the
    claim expires by itself, and a lost marker costs the next repeat a database read."""
    try:
        store.finish_payment(_ref(note), claim.token, note.fingerprint if processed else None, PROCESSED_TTL_S)
    except REDIS_DOWN as exc:
        log.warning("claim %s not released, marker not set (both expire): %s", claim.key, exc)


def audit_row(d: Receipt, note: PaymentNotification | RefundNotification) -> str:
    """The webhook_calls row of a verified webhook call as JSON (`ledger.write_call`'s columns,
    the body in base64), its verdict left out."""
    row = ledger.receipt_fields(d, note)
    row.update(body=base64.b64encode(d.body).decode(), received_at=d.received_at.isoformat())
    return json.dumps(row, separators=(",", ":"))


def _with_verdict(verdict: GateVerdict, row: str) -> str:
    return f'{{"verdict":"{verdict}","status_code":{STATUS[verdict]},{row[1:]}'


def _queue_apart(
    store: Store, queue_redis: Store, queue: Queue, ref: PaymentRef, *, audited: str, raw: str, request_id: str | None
) -> None:
    """Queue the audit row `raw` on the queue's own Redis; `audited` is its member of the
    gate's set (verdict:SHA-256), taken back if the row is lost."""
    try:
        settle_queue.push(queue_redis.redis, queue, [raw], request_id=request_id, key=keys.WEBHOOK_CALLS_PENDING)
    except REDIS_DOWN as exc:
        log.warning("webhook call audit queue unreachable (%s): writing the row directly", exc)
        try:
            with db.connection_context():
                write_rows([raw])
        except UNAVAILABLE_ERRORS:
            log.error("webhook call audit row LOST from queue and database: %s", raw)
            try:  # the gate counts it handed over: let the next repeat queue it again
                store.redis.srem(ref.audited, audited)
            except REDIS_DOWN:
                pass  # it expires (AUDITED_TTL_MS), and write_rows writes a later repeat's row


def write_rows(raws: list[str]) -> int:
    """Insert queued audit rows (JSON from the gate) into webhook_calls, in one statement;
    return how many were written. A replayed webhook call costs no storage per replay: a row whose
    (provider, reference, body SHA-256, verdict) is already written is dropped, and one whose
    body is already kept under another verdict is written without it (its length and hash
    stay), so a payment keeps each body once and at most one row per body and verdict. The
    repeats are counted by floodgate_payments_total."""
    rows = [json.loads(raw) for raw in raws]
    written, bodies = _written([r for r in rows if r.get("reference") and r.get("body_sha256")])
    kept = []
    for row in rows:
        body_key = (row["provider"], row.get("reference"), row.get("body_sha256"))
        if body_key[1] and body_key[2]:
            if (*body_key, row["verdict"]) in written:
                continue
            written.add((*body_key, row["verdict"]))
            if body_key in bodies:
                row["body"], row["body_truncated"] = "", False
            bodies.add(body_key)
        row["body"] = base64.b64decode(row["body"])
        row["received_at"] = datetime.fromisoformat(row["received_at"])
        kept.append(row)
    fastsql.insert_many(WebhookCall, kept)
    if len(kept) < len(rows):
        log.info("%d repeated payment webhook calls not written again", len(rows) - len(kept))
    return len(kept)


def _written(rows: list[dict[str, Any]]) -> tuple[set[tuple[str, str, str, str]], set[tuple[str, str, str]]]:
    """Of these rows' (provider, reference, body SHA-256): the (…, verdict) already written,
    and those whose body is already kept (one read on the (provider, reference) index: the
    provider must be in the condition for the index to serve it, else the table is scanned)."""
    if not rows:
        return set(), set()
    d = WebhookCall
    query = (
        d.select(d.provider, d.reference, d.body_sha256, d.verdict, pw.fn.LENGTH(d.body) > 0)
        .where(
            d.provider.in_({r["provider"] for r in rows}),
            d.reference.in_({r["reference"] for r in rows}),
            d.body_sha256.in_({r["body_sha256"] for r in rows}),
        )
        .tuples()
    )
    found = cast("list[tuple[str, str, str, str, int]]", list(query))  # peewee's stubs: .tuples() yields models
    written, bodies = set(), set()
    for provider, reference, sha, verdict, has_body in found:
        written.add((provider, reference, sha, verdict))
        if has_body:
            bodies.add((provider, reference, sha))
    return written, bodies
