"""The events' sending engine, the worker's side of the outbox (workers/outbox.py runs it):
fan-out (one dispatch per endpoint that wants an event, with a stable `webhook-id`), send (each
entity's queue in order, queues and endpoints in parallel), write (each finished chain in one
transaction: its state, an attempt row each, the endpoint's health). Only rows still `pending`
change when an outcome is written, so a second engine (a lost lock) can send a dispatch twice,
with the same webhook-id, never lose one. docs/events.md "Sending"."""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, cast

import peewee as pw
from standardwebhooks.webhooks import Webhook

from webhooks import outbound
from webhooks.events import endpoints as eps
from webhooks.events.endpoints import MANAGED_ID, Endpoint
from webhooks.events.outbox import new_id
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Event, EventAttempt, EventDispatch, EventEndpoint, utcnow

log = logging.getLogger(__name__)

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
FAN_OUT_BATCH = 200  # events fanned out per transaction
INSERT_CHUNK = 1000  # dispatch rows per INSERT
PER_ENDPOINT = 8  # tasks of one endpoint in flight at once (one while it is failing)
QUEUES_PER_TASK = 8  # queues one task sends one after the other (fewer writes per dispatch)
REFRESH_S = 1.0  # how often a drain reads the endpoints again
PER_CHAIN = 20  # dispatches of one queue sent in a row
MAX_ERROR = 500
# The dispatches behind a `failed` one wait for an operator (events retry, enabling): not due.
HELD = datetime(9999, 1, 1)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential back-off with jitter: the n-th failed attempt waits between half and all of
    min(max_ms, base_ms * 2^(n-1)); a dispatch failing for `retry_for_s` since its first attempt
    is given up (`failed`)."""

    base_ms: int
    max_ms: int
    retry_for_s: int

    def delay_s(self, attempts: int, rng: random.Random | None = None) -> float:
        ceiling: float = min(self.max_ms, self.base_ms * 2 ** min(max(attempts, 1) - 1, 40)) / 1000
        jitter: float = (rng or random).uniform(0, ceiling / 2)
        return ceiling / 2 + jitter


@dataclass(frozen=True)
class Attempt:
    """One POST: when, what came back (None: no answer), what went wrong (None: a 2xx), how long."""

    at: datetime
    status_code: int | None
    error: str | None
    ms: int

    @property
    def ok(self) -> bool:
        return self.error is None


class Sender:
    """POSTs an event's body to one endpoint, signed per Standard Webhooks: `webhook-id` (the
    dispatch's, the same on every attempt), `webhook-timestamp` (this attempt) and
    `webhook-signature` (one `v1,<base64>` per secret: two while the managed secret is rotated).
    Through the one outbound path: a hard total deadline of `timeout_s` for connect, send and
    the whole reply, of which at most 64 KiB is read (a 2xx is a success however long)."""

    def __init__(self, url: str, secrets: tuple[str, ...], timeout_s: float, client: outbound.Client | None = None):
        self.url, self.timeout_s, self.client = url, timeout_s, client or outbound.Client()
        self.signers = [Webhook(secret) for secret in secrets]

    def headers(self, webhook_id: str, body: str, now: float) -> dict[str, str]:
        stamp = datetime.fromtimestamp(int(now), tz=timezone.utc)
        return {
            "webhook-id": webhook_id,
            "webhook-timestamp": str(int(now)),
            "webhook-signature": " ".join(s.sign(webhook_id, stamp, body) for s in self.signers),
            "Content-Type": "application/json",
            "User-Agent": "Floodgate-Events/1",
        }

    def send(self, webhook_id: str, body: str) -> Attempt:
        """One attempt."""
        at = utcnow()
        data = body.encode()
        headers = self.headers(webhook_id, body, time.time()) | {"Content-Length": str(len(data))}
        reply = self.client.request("POST", self.url, body=data, headers=headers, deadline_s=self.timeout_s)
        if reply.failure is not None:  # the URL's secrets stay out of the message
            return Attempt(at, None, (reply.error or reply.failure.value)[:MAX_ERROR], reply.ms)
        return Attempt(at, reply.status, None if reply.ok else f"HTTP {reply.status}", reply.ms)


def fan_out(endpoints: list[Endpoint], now: datetime, limit: int = FAN_OUT_BATCH) -> int:
    """Fan the oldest events not yet fanned out into dispatches, in one transaction; how many
    events. A dispatch joining a queue that waits (back-off, or held behind a failed one) waits
    with it. Repeating it is harmless: (event, endpoint) is unique."""
    with db.atomic():
        events = list(
            Event.select(Event.id, Event.event_id, Event.type, Event.entity, Event.publisher_id)
            .where(Event.fanned_out == False)  # noqa: E712 - SQL, not Python
            .order_by(Event.id)
            .limit(limit)
        )
        if not events:
            return 0
        rows: list[dict[str, Any]] = [
            {
                "event": e.id,
                "endpoint_id": ep.id,
                "entity": e.entity,
                "webhook_id": e.event_id if ep.id == MANAGED_ID else new_id(),
                "status": PENDING,
                "attempts": 0,
                "created_at": now,
                "next_attempt_at": now,
            }
            for e in events
            for ep in endpoints
            if ep.wants(e.type, e.publisher_id)
        ]
        waiting = _waiting_queues({r["entity"] for r in rows}, {r["endpoint_id"] for r in rows})
        for row in rows:
            row["next_attempt_at"] = max(now, waiting.get((row["endpoint_id"], row["entity"]), now))
        for i in range(0, len(rows), INSERT_CHUNK):
            EventDispatch.insert_many(rows[i : i + INSERT_CHUNK]).on_conflict_ignore().execute()
        Event.update(fanned_out=True).where(Event.id.in_([e.id for e in events])).execute()
    return len(events)


def _waiting_queues(entities: set[str], endpoint_ids: set[str]) -> dict[tuple[str, str], datetime]:
    """Of these entities' queues at these endpoints, those with a dispatch not yet delivered:
    until when they wait. (The endpoints are named so that the (entity, endpoint_id, status)
    index serves the whole condition, not the entities' every dispatch ever made.)"""
    found: dict[tuple[str, str], datetime] = {}
    listed = list(entities)
    for i in range(0, len(listed), 500):
        rows = cast(
            "list[tuple[str, str, str, datetime | str]]",
            EventDispatch.select(
                EventDispatch.endpoint_id, EventDispatch.entity, EventDispatch.status, EventDispatch.next_attempt_at
            )
            .where(
                EventDispatch.entity.in_(listed[i : i + 500]),
                EventDispatch.endpoint_id.in_(list(endpoint_ids)),
                EventDispatch.status.in_([PENDING, FAILED]),
            )
            .tuples(),
        )
        for endpoint_id, entity, status, next_at in rows:
            until = HELD if status == FAILED else _naive(next_at)
            found[(endpoint_id, entity)] = max(found.get((endpoint_id, entity), until), until)
    return found


def _naive(value: datetime | str) -> datetime:
    return datetime.fromisoformat(value) if isinstance(value, str) else value  # SQLite: text


@dataclass
class Due:
    """A dispatch about to be sent, with what it sends."""

    dispatch: EventDispatch
    body: str
    created_at: datetime  # the event's: its lag is measured from here


def _due(row: EventDispatch) -> Due:
    """A dispatch read with its event's body and time (`.objects()`: joined columns on the row)."""
    return Due(row, getattr(row, "body"), _naive(getattr(row, "event_created_at")))  # noqa: B009


def due_chains(endpoint_id: str, now: datetime, chains: int, busy: Iterable[str]) -> list[list[Due]]:
    """Up to `chains` queues of the endpoint whose head is due (none of `busy`, the entities in
    flight): each head with the pending dispatches after it in its queue, oldest first."""
    earlier = EventDispatch.alias("earlier")
    query = (
        EventDispatch.select(EventDispatch, Event.body, Event.created_at.alias("event_created_at"))
        .join(Event, on=(Event.id == EventDispatch.event))
        .where(
            EventDispatch.endpoint_id == endpoint_id,
            EventDispatch.status == PENDING,
            EventDispatch.next_attempt_at <= now,
            # one NOT EXISTS per status, each an equality: the (entity, endpoint_id, status, id)
            # index then serves it whole (with `status IN` it served only the first two columns
            # and read the queue's whole history, delivered dispatches included)
            *(
                ~pw.fn.EXISTS(
                    earlier.select(pw.SQL("1")).where(
                        earlier.entity == EventDispatch.entity,
                        earlier.endpoint_id == EventDispatch.endpoint_id,
                        earlier.status == status,
                        earlier.id < EventDispatch.id,
                    )
                )
                for status in (PENDING, FAILED)
            ),
        )
        .order_by(EventDispatch.next_attempt_at, EventDispatch.id)
        .limit(chains)
    )
    busy = list(busy)
    if busy:
        query = query.where(EventDispatch.entity.not_in(busy))
    heads = [_due(row) for row in query.objects()]
    if not heads:
        return []
    found = {h.dispatch.entity: [h] for h in heads}
    following = (
        EventDispatch.select(EventDispatch, Event.body, Event.created_at.alias("event_created_at"))
        .join(Event, on=(Event.id == EventDispatch.event))
        .where(
            EventDispatch.entity.in_(list(found)),
            EventDispatch.endpoint_id == endpoint_id,
            EventDispatch.status.in_([PENDING, FAILED]),
        )
        .order_by(EventDispatch.id)
        .limit(len(found) * (PER_CHAIN + 1))
        .objects()
    )
    closed: set[str] = set()
    for row in following:
        chain = found[row.entity]
        if row.id <= chain[0].dispatch.id or row.entity in closed:
            continue
        if row.status != PENDING or len(chain) >= PER_CHAIN:
            closed.add(row.entity)
            continue
        chain.append(_due(row))
    return list(found.values())


def send_chains(sender: Sender, chains: list[list[Due]]) -> list[tuple[Due, Attempt]]:
    """Send queues of one endpoint one after the other, each in order; stop at the first failure
    (the rest of that queue must wait, and the endpoint is failing: the other queues wait for
    the next try rather than each costing a timeout now). No send starts once one deadline has
    passed since the first: a task ends within two deadlines however slowly the endpoint
    answers, so a drain handing over never waits longer for it (the rest waits, unsent)."""
    sent: list[tuple[Due, Attempt]] = []
    stop_at = time.monotonic() + sender.timeout_s
    for chain in chains:
        for due in chain:
            if time.monotonic() >= stop_at:
                return sent
            attempt = sender.send(due.dispatch.webhook_id, due.body)
            sent.append((due, attempt))
            if not attempt.ok:
                return sent
    return sent


@dataclass
class Written:
    """What writing finished chains did."""

    delivered: list[Due] = field(default_factory=list)
    lags_s: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # the endpoint of each failed attempt
    gave_up: list[str] = field(default_factory=list)  # the endpoint of each dispatch given up
    disabled: list[str] = field(default_factory=list)


def write(outcomes: list[tuple[str, list[tuple[Due, Attempt]]]], policy: RetryPolicy, disable_after_s: int) -> Written:
    """Write finished chains (endpoint id, its sends) in one transaction: the delivered ones
    with one statement, each failed one with its own (its back-off), an attempt row each, and
    each endpoint's health."""
    done = Written()
    if not outcomes:
        return done
    sends = [(due, attempt) for _endpoint_id, sent in outcomes for due, attempt in sent]
    with db.atomic():
        delivered = [(due, attempt) for due, attempt in sends if attempt.ok]
        if delivered:
            at = max(a.at for _, a in delivered)
            ids = [due.dispatch.id for due, _ in delivered]
            EventDispatch.update(
                status=DELIVERED,
                delivered_at=at,
                last_attempt_at=at,
                first_attempt_at=pw.fn.COALESCE(EventDispatch.first_attempt_at, at),
                attempts=EventDispatch.attempts + 1,
                last_error=None,
            ).where(EventDispatch.id.in_(ids), EventDispatch.status == PENDING).execute()
            done.delivered += [due for due, _ in delivered]
            done.lags_s += [(a.at - due.created_at).total_seconds() for due, a in delivered]
        for due, attempt in sends:
            if not attempt.ok:
                _write_failure(due, attempt, policy, done)
        EventAttempt.insert_many(
            [
                {
                    "dispatch_id": due.dispatch.id,
                    "at": attempt.at,
                    "status_code": attempt.status_code,
                    "error": attempt.error,
                    "ms": attempt.ms,
                }
                for due, attempt in sends
            ]
        ).execute()
        by_endpoint: dict[str, list[Attempt]] = defaultdict(list)
        for endpoint_id, sent in outcomes:
            by_endpoint[endpoint_id].extend(a for _, a in sent)
        healthy = [e for e, tried in by_endpoint.items() if all(a.ok for a in tried)]
        if healthy:  # every attempt a success: one statement for them all
            at = max(a.at for e in healthy for a in by_endpoint[e])
            EventEndpoint.update(failing_since=None, last_success_at=at, last_attempt_at=at).where(
                EventEndpoint.id.in_(healthy)
            ).execute()
        for endpoint_id, tried in by_endpoint.items():
            if endpoint_id not in healthy and _write_health(
                endpoint_id, sorted(tried, key=lambda a: a.at), disable_after_s
            ):
                done.disabled.append(endpoint_id)
    return done


def _write_failure(due: Due, attempt: Attempt, policy: RetryPolicy, done: Written) -> None:
    d = due.dispatch
    first = d.first_attempt_at or attempt.at
    done.failed.append(d.endpoint_id)
    give_up = (attempt.at - first).total_seconds() >= policy.retry_for_s
    if give_up:
        done.gave_up.append(d.endpoint_id)
    next_at = attempt.at + timedelta(seconds=policy.delay_s(d.attempts + 1))
    EventDispatch.update(
        status=FAILED if give_up else PENDING,
        attempts=EventDispatch.attempts + 1,
        first_attempt_at=first,
        last_attempt_at=attempt.at,
        last_error=attempt.error,
        next_attempt_at=next_at,
    ).where(EventDispatch.id == d.id, EventDispatch.status == PENDING).execute()
    # the rest of its queue waits with it (so that no due scan reads them until then)
    EventDispatch.update(next_attempt_at=HELD if give_up else next_at).where(
        EventDispatch.entity == d.entity,
        EventDispatch.endpoint_id == d.endpoint_id,
        EventDispatch.status == PENDING,
        EventDispatch.id > d.id,
    ).execute()
    if give_up:
        log.warning(
            "event dispatch %s to %s failed for %s s: given up after %d attempts (%s)",
            d.webhook_id,
            d.endpoint_id,
            policy.retry_for_s,
            d.attempts + 1,
            attempt.error,
        )


def _write_health(endpoint_id: str, tried: list[Attempt], disable_after_s: int) -> bool:
    """An endpoint's health after these attempts (in time order): failing since its first
    failure after its last success; disabled when that is `disable_after_s` ago. True when
    this disabled it."""
    row = EventEndpoint.get_or_none(EventEndpoint.id == endpoint_id)
    if row is None:  # deleted meanwhile
        return False
    failing_since, last_error, last_success = row.failing_since, row.last_error, row.last_success_at
    for attempt in tried:
        if attempt.ok:
            failing_since, last_success = None, attempt.at
        else:
            failing_since, last_error = failing_since or attempt.at, attempt.error
    last = tried[-1].at
    disable = bool(
        row.enabled and failing_since is not None and (last - failing_since).total_seconds() >= disable_after_s
    )
    changes = {
        "failing_since": failing_since,
        "last_error": last_error,
        "last_success_at": last_success,
        "last_attempt_at": last,
    }
    if disable:
        changes |= {"enabled": False, "disabled_reason": eps.FAILING, "disabled_at": last}
        log.warning(
            "event endpoint %s disabled: failing since %s (EVENT_ENDPOINT_DISABLE_AFTER_S=%s); its events "
            "are kept and go out, in order, when it is enabled again",
            endpoint_id,
            failing_since.isoformat() if failing_since else "?",
            disable_after_s,
        )
    EventEndpoint.update(**changes).where(EventEndpoint.id == endpoint_id).execute()
    return disable


def next_due_s(enabled: list[str], now: datetime) -> float | None:
    """Seconds until a dispatch to an enabled endpoint may be due (0: one is), None when none
    is pending. Queues behind a failed dispatch are not counted (they wait for an operator)."""
    if not enabled:
        return None
    earliest = (
        EventDispatch.select(pw.fn.MIN(EventDispatch.next_attempt_at))
        .where(
            EventDispatch.endpoint_id.in_(enabled),
            EventDispatch.status == PENDING,
            EventDispatch.next_attempt_at < HELD,
        )
        .scalar()
    )
    if earliest is None:
        return None
    return max(0.0, (_naive(earliest) - now).total_seconds())


def work_waiting(enabled: list[str], now: datetime) -> bool:
    """Whether an event waits for fan-out or a dispatch is due (the scheduled sweep's question)."""
    if Event.select().where(Event.fanned_out == False).exists():  # noqa: E712 - SQL
        return True
    due = next_due_s(enabled, now)
    return due == 0


class Engine:
    """Fan-out and sending for one drain: chains run on `pool`, each written when it is done."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        policy: RetryPolicy,
        timeout_s: float,
        disable_after_s: int,
        *,
        managed_secrets: tuple[str, ...] = (),
        now: Callable[[], datetime] = utcnow,
        client: outbound.Client | None = None,
    ):
        self.pool, self.policy, self.timeout_s = pool, policy, timeout_s
        self.disable_after_s, self.managed_secrets, self.now = disable_after_s, managed_secrets, now
        self.client = client or outbound.Client()
        self.endpoints: list[Endpoint] = []
        self.senders: dict[tuple[str, str, tuple[str, ...]], Sender] = {}
        self.in_flight: dict[Future[list[tuple[Due, Attempt]]], tuple[str, set[str]]] = {}
        self.refreshed = -REFRESH_S
        self.resting: dict[str, datetime] = {}  # a failing endpoint is not asked again before this

    def _sender(self, ep: Endpoint) -> Sender:
        key = (ep.id, ep.url, ep.secrets)
        if key not in self.senders:
            self.senders[key] = Sender(ep.url, ep.secrets, self.timeout_s, self.client)
        return self.senders[key]

    def enabled(self) -> list[str]:
        """The endpoints events go to now: enabled, and able to sign."""
        return [ep.id for ep in self.endpoints if ep.sendable]

    def refresh(self, force: bool = False) -> None:
        """Read the endpoints again, at most every REFRESH_S unless `force`."""
        if force or time.monotonic() - self.refreshed >= REFRESH_S:
            self.endpoints = eps.active(self.managed_secrets)
            self.refreshed = time.monotonic()

    def submit_due(self) -> int:
        """Start the chains that are due and not in flight; how many."""
        now = self.now()
        busy: dict[str, set[str]] = defaultdict(set)
        tasks: Counter[str] = Counter()
        for endpoint_id, entities in self.in_flight.values():
            busy[endpoint_id] |= entities
            tasks[endpoint_id] += 1
        started = 0
        for ep in self.endpoints:
            if not ep.sendable or self.resting.get(ep.id, now) > now:
                continue
            failing = ep.failing_since is not None
            room = (1 if failing else PER_ENDPOINT) - tasks[ep.id]
            if room <= 0:
                continue
            per_task = 1 if failing else QUEUES_PER_TASK
            chains = due_chains(ep.id, now, room * per_task, busy[ep.id])
            sender = self._sender(ep)
            for i in range(0, len(chains), per_task):
                batch = chains[i : i + per_task]
                future = self.pool.submit(send_chains, sender, batch)
                self.in_flight[future] = (ep.id, {c[0].dispatch.entity for c in batch})
                started += len(batch)
        return started

    def collect(self, timeout_s: float) -> Written:
        """Wait up to `timeout_s` for chains in flight, and write those that finished."""
        if not self.in_flight:
            return Written()
        finished, _ = wait(list(self.in_flight), timeout=timeout_s, return_when=FIRST_COMPLETED)
        outcomes = []
        for future in finished:
            endpoint_id, _entities = self.in_flight.pop(future)
            sent = future.result()  # send_chains catches what a request can raise
            outcomes.append((endpoint_id, sent))
            last = sent[-1][1] if sent else None
            if last is not None and not last.ok:  # rest until its retry is due
                self.resting[endpoint_id] = max(self.resting.get(endpoint_id, last.at), last.at) + timedelta(
                    seconds=self.policy.delay_s(1) / 2
                )
            elif last is not None:
                self.resting.pop(endpoint_id, None)
        written = write(outcomes, self.policy, self.disable_after_s)
        if written.failed:  # an endpoint's health changed: read it now (failing, disabled)
            self.refresh(force=True)
        return written

    def finish(self, keep: Callable[[], object] = lambda: None) -> Written:
        """Wait for every chain in flight and write it (a drain handing over, or stopping),
        calling `keep` every second meanwhile (the drain's lock)."""
        total = Written()
        while self.in_flight:
            keep()
            written = self.collect(1.0)
            total.delivered += written.delivered
            total.lags_s += written.lags_s
            total.failed += written.failed
            total.gave_up += written.gave_up
            total.disabled += written.disabled
        return total
