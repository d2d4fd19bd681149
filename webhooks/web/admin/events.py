"""Admin routes for event endpoints and the events log (docs/api.md "Event endpoints")."""

from __future__ import annotations

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import ValidationError
from webhooks.events import endpoints
from webhooks.events import log as events_log
from webhooks.events.outbox import EventType
from webhooks.formats import validate
from webhooks.formats.validate import is_id
from webhooks.storage.live import outbox_queue
from webhooks.web.http import json_body, query_arg

bp = Blueprint("events", __name__)

MAX_EVENTS = 1000
QUERY = "invalid_query"


def wake() -> None:
    svc = services.current()
    outbox_queue.wake(svc.queue_redis.redis, svc.queue)


@bp.put("/event-endpoints/<id:endpoint_id>")
def put_event_endpoint(endpoint_id: str) -> ResponseReturnValue:
    """Create or replace an endpoint; its secret in full only in the answer that made it."""
    row, new_secret = endpoints.save(endpoint_id, json_body())
    if row.enabled:
        wake()  # enabled again: what it kept is due now
    return jsonify(endpoints.to_json(row, show_secret=new_secret))


@bp.get("/event-endpoints")
def list_event_endpoints() -> ResponseReturnValue:
    return jsonify({"endpoints": [endpoints.to_json(row) for row in endpoints.listing()]})


@bp.get("/event-endpoints/<id:endpoint_id>")
def get_event_endpoint(endpoint_id: str) -> ResponseReturnValue:
    return jsonify(endpoints.to_json(endpoints.get(endpoint_id)))


@bp.delete("/event-endpoints/<id:endpoint_id>")
def delete_event_endpoint(endpoint_id: str) -> ResponseReturnValue:
    endpoints.delete(endpoint_id)
    return "", 204


@bp.post("/event-endpoints/<id:endpoint_id>/replay")
def replay_event_endpoint(endpoint_id: str) -> ResponseReturnValue:
    """Send the endpoint's events since `since` again, with the same webhook-ids."""
    endpoints.get(endpoint_id)  # 404 before the body is looked at
    body = json_body()
    if not isinstance(body, dict) or set(body) != {"since"}:
        raise ValidationError("invalid_replay", "body", 'must be an object {"since": "<ISO time>"}')
    count = events_log.replay(endpoint_id, validate.since(body["since"], "invalid_replay"))
    if count:
        wake()
    return jsonify({"replaying": count}), 202


@bp.get("/events")
def list_events() -> ResponseReturnValue:
    """The events log, newest first: `endpoint_id`, `type`, `status` (of a dispatch), `since`,
    `limit` (default 100), `before` (the `next` of the page before)."""
    endpoint_id = query_arg("endpoint_id")
    if endpoint_id is not None and not is_id(endpoint_id):
        raise ValidationError(QUERY, "endpoint_id", "must be an endpoint id")
    event_type = query_arg("type")
    if event_type is not None and event_type not in {t.value for t in EventType}:
        raise ValidationError(QUERY, "type", f"must be one of {', '.join(t.value for t in EventType)}")
    status = query_arg("status")
    if status is not None and status not in events_log.STATUSES:
        raise ValidationError(QUERY, "status", f"must be one of {', '.join(events_log.STATUSES)}")
    raw_since = query_arg("since")
    since = None if raw_since is None else validate.since(raw_since, QUERY)
    found, cursor = events_log.search(
        endpoint_id=endpoint_id,
        event_type=event_type,
        status=status,
        since=since,
        before=_integer("before", 1 << 62),
        limit=_integer("limit", MAX_EVENTS) or 100,
    )
    return jsonify({"events": found, "next": cursor})


def _integer(name: str, most: int) -> int | None:
    raw = query_arg(name)
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or not 1 <= int(raw) <= most:
        raise ValidationError(QUERY, name, f"must be an integer from 1 to {most}")
    return int(raw)


@bp.get("/events/<id:event_id>")
def get_event(event_id: str) -> ResponseReturnValue:
    return jsonify(events_log.one(event_id))
