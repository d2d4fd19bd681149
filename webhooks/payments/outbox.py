"""Payment events to the application (API.md "Payment events to your application"): a
transactional outbox.

Each credit and debit inserts its event (`record`) in the transaction that changes the wallet, so
an event exists exactly when its wallet change committed. The worker (workers/outbox.py) calls
`deliver_due` in a loop: it POSTs due events to PAYMENT_EVENTS_URL, signed per Standard Webhooks
(the `standardwebhooks` package), with the event's stable id as `webhook-id`. A customer's events
go out one after the other, oldest first: an event is only sent once every earlier event of that
customer is delivered. For one wallet that is the order its changes committed (each change inserts
its event while holding the wallet's row lock, so ids follow commits); changes of one customer in
two currencies committing at once have no order. A failed attempt is retried with exponential back-off
and jitter; an event still failing after `retry_for_s` (24 h by default) becomes `failed`, holds
the customer's later events back, and waits for `flask --app wsgi events retry`.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import StrEnum
from typing import cast

import peewee as pw
import requests
from standardwebhooks.webhooks import Webhook

from webhooks.logs import redact_text
from webhooks.storage.db import db
from webhooks.storage.models import PaymentEvent, utcnow

log = logging.getLogger(__name__)


class EventType(StrEnum):
    """A payment event's `type` (API.md): which way its wallet moved."""

    CREDITED = "wallet.credited"
    DEBITED = "wallet.debited"


class EventStatus(StrEnum):
    """A payment event's progress: pending (due, retried, or held behind an earlier event of
    its customer), delivered, or failed (given up until `events retry`)."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


# The members under the short names the callers (admin, /ops, the tests) use.
CREDITED, DEBITED = EventType.CREDITED, EventType.DEBITED
PENDING, DELIVERED, FAILED = EventStatus.PENDING, EventStatus.DELIVERED, EventStatus.FAILED

CUSTOMERS_PER_BATCH = 32  # customers served at once (one thread each)
EVENTS_PER_CUSTOMER = 20  # of one customer's queue, per batch, one after the other
BATCH_BUDGET_S = 2.0  # no new delivery starts in a batch after this (a slow receiver)
MAX_ERROR = 500


def record(
    kind: EventType,
    provider: str,
    reference: str,
    customer: str,
    currency: str,
    amount_minor: int,
    balance_minor: int,
    now: datetime,
) -> None:
    """Insert the event of one wallet change, in the caller's transaction (the outbox)."""
    body = json.dumps(
        {
            "type": kind,
            "data": {
                "provider": provider,
                "reference": reference,
                "customer": customer,
                "currency": currency,
                "amount_minor": amount_minor,
                "balance_minor": balance_minor,
            },
        },
        separators=(",", ":"),
    )
    PaymentEvent.insert(
        event_id="msg_" + uuid.uuid4().hex,
        type=kind,
        provider=provider,
        reference=reference,
        customer=customer,
        body=body,
        status=PENDING,
        attempts=0,
        created_at=now,
        next_attempt_at=now,
    ).execute()


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential back-off with jitter: the n-th failed attempt waits between half and all of
    min(max_ms, base_ms * 2^(n-1)); an event failing for `retry_for_s` since its first attempt
    is given up (`failed`)."""

    base_ms: int
    max_ms: int
    retry_for_s: int

    def delay_s(self, attempts: int, rng: random.Random | None = None) -> float:
        ceiling = min(self.max_ms, self.base_ms * 2 ** min(max(attempts, 1) - 1, 40)) / 1000
        return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


class Sender:
    """POSTs an event's body to the application, signed per Standard Webhooks: `webhook-id` (the
    event's id, the same on every attempt), `webhook-timestamp` (this attempt) and
    `webhook-signature` (one `v1,<base64>` per secret: two while the secret is rotated)."""

    def __init__(self, url: str, secrets: tuple[str, ...], timeout_s: float):
        self.url, self.timeout_s = url, timeout_s
        self.signers = [Webhook(secret) for secret in secrets]
        self._local = threading.local()

    def headers(self, event_id: str, body: str, now: float) -> dict[str, str]:
        stamp = datetime.fromtimestamp(int(now), tz=timezone.utc)
        return {
            "webhook-id": event_id,
            "webhook-timestamp": str(int(now)),
            "webhook-signature": " ".join(s.sign(event_id, stamp, body) for s in self.signers),
            "Content-Type": "application/json",
            "User-Agent": "Floodgate-Events/1",
        }

    def send(self, event_id: str, body: str) -> str | None:
        """Deliver once: None when the application answered 2xx, else what went wrong."""
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        try:
            resp = session.post(
                self.url,
                data=body.encode(),
                headers=self.headers(event_id, body, time.time()),
                timeout=(min(self.timeout_s, 5.0), self.timeout_s),
                allow_redirects=False,
            )
            resp.close()
        except requests.RequestException as exc:
            return redact_text(f"{type(exc).__name__}: {exc}")[:MAX_ERROR]  # the URL's secrets stay out
        if 200 <= resp.status_code < 300:
            return None
        return f"HTTP {resp.status_code}"


@dataclass
class Batch:
    """What one `deliver_due` did."""

    delivered: list[PaymentEvent]
    failed_attempts: int = 0
    gave_up: int = 0
    next_due_s: float | None = None  # seconds until the next event is due (None: none pending)

    @property
    def attempted(self) -> int:
        return len(self.delivered) + self.failed_attempts


def _heads() -> pw.ModelSelect[PaymentEvent]:
    """Each customer's oldest event not yet delivered: the only one of theirs that may be sent."""
    return (
        PaymentEvent.select(pw.fn.MIN(PaymentEvent.id))
        .where(PaymentEvent.status.in_([PENDING, FAILED]))
        .group_by(PaymentEvent.customer)
    )


def due_chains(
    now: datetime, customers: int = CUSTOMERS_PER_BATCH, per_customer: int = EVENTS_PER_CUSTOMER
) -> list[list[PaymentEvent]]:
    """Per customer whose oldest undelivered event is pending and due: that event and the pending
    ones after it (up to `per_customer`, stopping at a failed one), in the order they were made."""
    heads = list(
        PaymentEvent.select()
        .where(PaymentEvent.id.in_(_heads()), PaymentEvent.status == PENDING, PaymentEvent.next_attempt_at <= now)
        .order_by(PaymentEvent.id)
        .limit(customers)
    )
    if not heads:
        return []
    chains = {h.customer: [h] for h in heads}
    following = (
        PaymentEvent.select()
        .where(
            PaymentEvent.customer.in_(list(chains)),
            PaymentEvent.status.in_([PENDING, FAILED]),
            PaymentEvent.id > heads[0].id,
        )
        .order_by(PaymentEvent.id)
        .limit(customers * per_customer)
    )
    closed: set[str] = set()
    for event in following:
        chain = chains[event.customer]
        if event.id <= chain[0].id or event.customer in closed:
            continue
        if event.status != PENDING or len(chain) >= per_customer:
            closed.add(event.customer)  # a failed event holds back the rest of this customer's
            continue
        chain.append(event)
    return list(chains.values())


def next_due_s(now: datetime) -> float | None:
    """Seconds until the next pending event may be sent (0 when one is due), None when none is
    pending; events held behind an earlier one of their customer are not counted."""
    earliest = (
        PaymentEvent.select(pw.fn.MIN(PaymentEvent.next_attempt_at))
        .where(PaymentEvent.id.in_(_heads()), PaymentEvent.status == PENDING)
        .scalar()
    )
    if earliest is None:
        return None
    if isinstance(earliest, str):  # SQLite hands an aggregate back as text
        earliest = datetime.fromisoformat(earliest)
    return max(0.0, (earliest - now).total_seconds())


def _send_chain(
    sender: Sender, chain: list[PaymentEvent], deadline: float
) -> list[tuple[PaymentEvent, str | None, datetime]]:
    """Send one customer's events in order; stop at the first failure (the rest must wait)."""
    sent: list[tuple[PaymentEvent, str | None, datetime]] = []
    for event in chain:
        if sent and time.monotonic() > deadline:
            break
        error = sender.send(event.event_id, event.body)
        sent.append((event, error, utcnow()))
        if error is not None:
            break
    return sent


def deliver_due(
    sender: Sender,
    policy: RetryPolicy,
    pool: ThreadPoolExecutor,
    now: Callable[[], datetime] = utcnow,
    budget_s: float = BATCH_BUDGET_S,
) -> Batch:
    """One batch: send what is due (customers in parallel, each one's events in order), then
    write every outcome in one transaction. Only pending rows change, so a second drain
    running by accident (a lost lock) can only send an event twice, never lose one."""
    chains = due_chains(now())
    if not chains:
        return Batch([], next_due_s=next_due_s(now()))
    deadline = time.monotonic() + budget_s
    outcomes = [o for sent in pool.map(lambda c: _send_chain(sender, c, deadline), chains) for o in sent]
    batch = Batch([])
    with db.atomic():
        for event, error, at in outcomes:
            if error is None:
                changed = (
                    PaymentEvent.update(
                        status=DELIVERED,
                        delivered_at=at,
                        last_attempt_at=at,
                        first_attempt_at=event.first_attempt_at or at,
                        attempts=PaymentEvent.attempts + 1,
                        last_error=None,
                    )
                    .where(PaymentEvent.id == event.id, PaymentEvent.status == PENDING)
                    .execute()
                )
                if changed:
                    event.delivered_at = at
                    batch.delivered.append(event)
                continue
            batch.failed_attempts += 1
            first = event.first_attempt_at or at
            give_up = (at - first).total_seconds() >= policy.retry_for_s
            batch.gave_up += give_up
            (
                PaymentEvent.update(
                    status=FAILED if give_up else PENDING,
                    attempts=PaymentEvent.attempts + 1,
                    first_attempt_at=first,
                    last_attempt_at=at,
                    last_error=redact_text(error)[:MAX_ERROR],
                    next_attempt_at=at + timedelta(seconds=policy.delay_s(event.attempts + 1)),
                )
                .where(PaymentEvent.id == event.id, PaymentEvent.status == PENDING)
                .execute()
            )
            if give_up:
                log.warning(
                    "payment event %s (%s of %s:%s) failed for %s s: given up after %d attempts (%s)",
                    event.event_id,
                    event.type,
                    event.provider,
                    event.reference,
                    policy.retry_for_s,
                    event.attempts + 1,
                    error,
                )
    return batch


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat() + "Z"


def event_record(e: PaymentEvent) -> dict:
    """An event as the admin API shows it: its id (the `webhook-id`), what was sent, and how
    its delivery goes."""
    return {
        "id": e.event_id,
        "type": e.type,
        "status": e.status,
        "data": json.loads(e.body)["data"],
        "attempts": e.attempts,
        "created_at": _iso(e.created_at),
        "next_attempt_at": _iso(e.next_attempt_at),
        "last_attempt_at": _iso(e.last_attempt_at),
        "delivered_at": _iso(e.delivered_at),
        "last_error": e.last_error,
    }


def listing(statuses: tuple[EventStatus, ...], limit: int) -> list[dict]:
    """The oldest events in `statuses`, oldest first."""
    rows = PaymentEvent.select().where(PaymentEvent.status.in_(list(statuses))).order_by(PaymentEvent.id).limit(limit)
    return [event_record(e) for e in rows]


def counts() -> dict[str, int]:
    """How many events are pending and failed (delivered ones are not counted)."""
    found: dict[str, int] = dict(
        cast(
            "list[tuple[str, int]]",
            PaymentEvent.select(  # .tuples(): no models
                PaymentEvent.status, pw.fn.COUNT(PaymentEvent.id)
            )
            .where(PaymentEvent.status.in_([PENDING, FAILED]))
            .group_by(PaymentEvent.status)
            .tuples(),
        )
    )
    return {PENDING: found.get(PENDING, 0), FAILED: found.get(FAILED, 0)}


def retry_failed(now: datetime | None = None) -> int:
    """Give every failed event a new round of attempts, due now (`events retry`); their
    customers' later events follow them in order."""
    return (
        PaymentEvent.update(status=PENDING, next_attempt_at=now or utcnow(), first_attempt_at=None)
        .where(PaymentEvent.status == FAILED)
        .execute()
    )
