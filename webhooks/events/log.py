"""What the admin API, the CLI and /ops show of events: each event with its dispatches and
every attempt (the events log), the backlog per endpoint, replay and retry. The admin API's
JSON keeps its field names (`deliveries`, `delivered_at`): docs/api.md."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from typing import Any, cast

import peewee as pw

from webhooks.errors import NotFound
from webhooks.events.endpoints import MANAGED_ID
from webhooks.events.outbox import WALLET_TYPES
from webhooks.events.sender import DELIVERED, FAILED, HELD, PENDING
from webhooks.storage.records import audit
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Event, EventAttempt, EventDispatch, EventEndpoint, utcnow

STATUSES = (PENDING, DELIVERED, FAILED)
REPLAY_CHUNK = 5000  # dispatches reset per statement


def _iso(value: datetime | str | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):  # SQLite hands joined columns back as text
        value = datetime.fromisoformat(value)
    return value.isoformat() + "Z"


def _attempt(a: EventAttempt, endpoint_id: str) -> dict[str, Any]:
    return {"endpoint_id": endpoint_id, "at": _iso(a.at), "status_code": a.status_code, "error": a.error, "ms": a.ms}


def _dispatch(d: EventDispatch) -> dict[str, Any]:
    return {
        "endpoint_id": d.endpoint_id,
        "webhook_id": d.webhook_id,
        "status": d.status,
        "attempt_count": d.attempts,
        "next_attempt_at": _iso(d.next_attempt_at) if d.status == PENDING else None,
        "delivered_at": _iso(d.delivered_at),
        "last_error": d.last_error,
    }


def records(events: list[Event], endpoint_id: str | None = None) -> list[dict[str, Any]]:
    """Events as the admin API shows them: what was sent, each dispatch, each attempt (oldest
    first); only `endpoint_id`'s dispatches when given."""
    if not events:
        return []
    dispatches = EventDispatch.select().where(EventDispatch.event.in_([e.id for e in events]))
    if endpoint_id is not None:
        dispatches = dispatches.where(EventDispatch.endpoint_id == endpoint_id)
    by_event: dict[int, list[EventDispatch]] = defaultdict(list)
    for d in dispatches.order_by(EventDispatch.id):
        by_event[d.event].append(d)
    endpoint_of = {d.id: d.endpoint_id for ds in by_event.values() for d in ds}
    attempts: dict[int, list[EventAttempt]] = defaultdict(list)
    if endpoint_of:
        for a in EventAttempt.select().where(EventAttempt.dispatch_id.in_(list(endpoint_of))).order_by(EventAttempt.id):
            attempts[a.dispatch_id].append(a)
    out = []
    for e in events:
        body = json.loads(e.body)
        out.append(
            {
                "id": e.event_id,
                "type": e.type,
                "data": body["data"],
                "created_at": _iso(e.created_at),
                "deliveries": [_dispatch(d) for d in by_event[e.id]],
                "attempts": [
                    _attempt(a, endpoint_of[a.dispatch_id])
                    for a in sorted((a for d in by_event[e.id] for a in attempts[d.id]), key=lambda a: (a.at, a.id))
                ],
            }
        )
    return out


def search(
    *,
    endpoint_id: str | None = None,
    event_type: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    before: int | None = None,
    limit: int = 100,
) -> tuple[list[dict[str, Any]], int | None]:
    """Events, newest first, filtered: of a type, since a time, with a dispatch (to
    `endpoint_id`) in `status`. Returns the page and the cursor of the next (None: last page)."""
    query = Event.select()
    if event_type is not None:
        query = query.where(Event.type == event_type)
    if since is not None:
        query = query.where(Event.created_at >= since)
    if before is not None:
        query = query.where(Event.id < before)
    if endpoint_id is not None or status is not None:
        matching = EventDispatch.select(EventDispatch.event)
        if endpoint_id is not None:
            matching = matching.where(EventDispatch.endpoint_id == endpoint_id)
        elif status in (PENDING, FAILED):
            # only an endpoint that exists has undelivered dispatches (they go with it when it
            # is deleted): naming them lets the (endpoint_id, status, ...) index serve the read,
            # which by status alone read every dispatch ever made (the /ops page, every refresh)
            matching = matching.where(EventDispatch.endpoint_id.in_(_endpoint_ids()))
        if status is not None:
            matching = matching.where(EventDispatch.status == status)
        query = query.where(Event.id.in_(matching))
    page = list(query.order_by(Event.id.desc()).limit(limit + 1))
    more = len(page) > limit
    page = page[:limit]
    return records(page, endpoint_id), (page[-1].id if more else None)


def one(event_id: str) -> dict[str, Any]:
    event = Event.get_or_none(Event.event_id == event_id)
    if event is None:
        raise NotFound(f"no event {event_id!r}")
    return records([event])[0]


def replay(endpoint_id: str, since: datetime) -> int:
    """Send the endpoint's dispatches of events since `since` again, due now, with their own
    webhook-ids (delivered ones included); how many. In order per entity, as always: the
    oldest goes first. Each chunk commits on its own, so a long outage's week is no lock held
    for minutes; a replay cut short is simply asked for again."""
    if EventEndpoint.get_or_none(EventEndpoint.id == endpoint_id) is None:
        raise NotFound(f"no event endpoint {endpoint_id!r}")
    since_events = Event.select(Event.id).where(Event.created_at >= since)
    first = (
        EventDispatch.select(pw.fn.MIN(EventDispatch.id))
        .where(EventDispatch.endpoint_id == endpoint_id, EventDispatch.event.in_(since_events))
        .scalar()
    )
    if first is None:
        return 0
    last = EventDispatch.select(pw.fn.MAX(EventDispatch.id)).where(EventDispatch.endpoint_id == endpoint_id).scalar()
    count = 0
    for low in range(first, last + 1, REPLAY_CHUNK):
        in_chunk = (
            (EventDispatch.endpoint_id == endpoint_id)
            & (EventDispatch.id >= low)
            & (EventDispatch.id < low + REPLAY_CHUNK)
            & EventDispatch.event.in_(since_events)
        )
        with db.atomic():
            count += EventDispatch.select().where(in_chunk).count()
            EventDispatch.update(status=PENDING, next_attempt_at=utcnow(), first_attempt_at=None).where(
                in_chunk
            ).execute()
    with db.atomic():
        detail = {"since": since, "replaying": count}
        audit.record("admin", "event_endpoint.replay", "event_endpoint", endpoint_id, detail)
    return count


def retry_failed(now: datetime | None = None) -> int:
    """Give every failed dispatch a new round of attempts, due now (`events retry`), and the
    dispatches held behind them; how many were failed."""
    now = now or utcnow()
    with db.atomic():
        failed: int = (
            EventDispatch.update(status=PENDING, next_attempt_at=now, first_attempt_at=None)
            .where(EventDispatch.status == FAILED)
            .execute()
        )
        EventDispatch.update(next_attempt_at=now).where(
            EventDispatch.status == PENDING, EventDispatch.next_attempt_at >= HELD
        ).execute()
        if failed:
            audit.record("admin", "events.retry", "event_dispatch", "failed", {"retried": failed})
    return failed


def _endpoint_ids() -> list[str]:
    return [e.id for e in EventEndpoint.select(EventEndpoint.id)]


def backlog(endpoint_id: str | None = None) -> dict[str, dict[str, int]]:
    """Per endpoint (or of `endpoint_id` only), its dispatches not yet delivered, by status.
    The endpoints are named in the condition, so that the (endpoint_id, status, ...) index
    serves it: by status alone MariaDB read every dispatch ever made (a deleted endpoint's
    undelivered dispatches go with it)."""
    ids = [endpoint_id] if endpoint_id is not None else _endpoint_ids()
    query = EventDispatch.select(EventDispatch.endpoint_id, EventDispatch.status, pw.fn.COUNT(EventDispatch.id)).where(
        EventDispatch.endpoint_id.in_(ids), EventDispatch.status.in_([PENDING, FAILED])
    )
    rows = cast(
        "list[tuple[str, str, int]]",
        query.group_by(EventDispatch.endpoint_id, EventDispatch.status).tuples(),
    )
    found: dict[str, dict[str, int]] = defaultdict(lambda: {PENDING: 0, FAILED: 0})
    for endpoint_id, status, n in rows:
        found[endpoint_id][status] = n
    return dict(found)


def not_fanned_out() -> int:
    return Event.select().where(Event.fanned_out == False).count()  # noqa: E712 - SQL


# PAYMENT_EVENTS_URL's view (docs/api.md "Payment events to your application"): its dispatches.


def payment_event_view(d: Any) -> dict[str, Any]:
    """A dispatch to PAYMENT_EVENTS_URL as GET /v1/admin/payment-events shows it."""
    return {
        "id": d.webhook_id,
        "type": d.type,
        "status": d.status,
        "data": json.loads(d.body)["data"],
        "attempts": d.attempts,
        "created_at": _iso(d.event_created_at),
        "next_attempt_at": _iso(d.next_attempt_at),
        "last_attempt_at": _iso(d.last_attempt_at),
        "delivered_at": _iso(d.delivered_at),
        "last_error": d.last_error,
    }


def payment_events(statuses: tuple[str, ...], limit: int, configured: bool = True) -> list[dict[str, Any]]:
    """The oldest dispatches to PAYMENT_EVENTS_URL in `statuses`, oldest first; while it is
    `configured`, wallet events the worker has not fanned out yet count as pending ones."""
    rows = (
        EventDispatch.select(EventDispatch, Event.type, Event.body, Event.created_at.alias("event_created_at"))
        .join(Event, on=(Event.id == EventDispatch.event))
        .where(EventDispatch.endpoint_id == MANAGED_ID, EventDispatch.status.in_(list(statuses)))
        .order_by(EventDispatch.id)
        .limit(limit)
        .objects()
    )
    found = [payment_event_view(d) for d in rows]
    if configured and PENDING in statuses and len(found) < limit:
        found += [_not_fanned_out(e) for e in _wallet_events_not_fanned_out().limit(limit - len(found))]
    return found


def _wallet_events_not_fanned_out() -> pw.ModelSelect[Event]:
    return (
        Event.select()
        .where(Event.fanned_out == False, Event.type.in_(list(WALLET_TYPES)))  # noqa: E712 - SQL
        .order_by(Event.id)
    )


def _not_fanned_out(e: Event) -> dict[str, Any]:
    return {
        "id": e.event_id,
        "type": e.type,
        "status": PENDING,
        "data": json.loads(e.body)["data"],
        "attempts": 0,
        "created_at": _iso(e.created_at),
        "next_attempt_at": _iso(e.created_at),
        "last_attempt_at": None,
        "delivered_at": None,
        "last_error": None,
    }


def payment_event_counts(configured: bool = True) -> dict[str, int]:
    """How many dispatches to PAYMENT_EVENTS_URL are pending and failed (while it is
    `configured`, wallet events not fanned out yet among the pending)."""
    counts = dict(backlog(MANAGED_ID).get(MANAGED_ID, {PENDING: 0, FAILED: 0}))
    if configured:
        counts[PENDING] += _wallet_events_not_fanned_out().count()
    return counts
