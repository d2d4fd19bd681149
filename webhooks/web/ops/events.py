"""The console's events: the endpoints with their backlog, the deliveries given up on with a
button that sends them again (`events retry`), and a replay of an endpoint's events since a
time (as POST /v1/admin/event-endpoints/<id>/replay)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import BadRequest
from webhooks.events import endpoints
from webhooks.events import log as events_log
from webhooks.formats import validate
from webhooks.storage.live import outbox_queue
from webhooks.web.ops.console import audit_rows, done, page
from webhooks.web.ops.page import event_panel

bp = Blueprint("events", __name__)

SECTION = "ops.events.events"


def wake() -> None:
    svc = services.current()
    outbox_queue.wake(svc.queue_redis.redis, svc.queue)


def _events_page(status: int = 200, error: tuple[str, str] | None = None) -> ResponseReturnValue:
    day_ago = (datetime.now(timezone.utc) - timedelta(days=1)).replace(microsecond=0).isoformat()
    audit = audit_rows("event_endpoint", limit=10) + audit_rows("event_dispatch", limit=10)
    audit.sort(key=lambda row: row["id"], reverse=True)
    return page("events.html", SECTION, status, events=event_panel(), day_ago=day_ago, error=error, audit=audit)


@bp.get("/ops/events")
def events() -> ResponseReturnValue:
    return _events_page()


@bp.post("/ops/events/retry")
def events_retry() -> ResponseReturnValue:
    """Every failed delivery gets a new round of attempts, due now, in order per entity."""
    if events_log.retry_failed():
        wake()
    return done("ops.events.events", "retried")


@bp.post("/ops/events/<id:endpoint_id>/replay")
def events_replay(endpoint_id: str) -> ResponseReturnValue:
    """Send the endpoint's events since the form's `since` again, with their webhook-ids."""
    endpoints.get(endpoint_id)  # 404 for no such endpoint
    try:
        count = events_log.replay(endpoint_id, validate.since(request.form.get("since", ""), "invalid_replay"))
    except BadRequest as exc:
        return _events_page(400, (endpoint_id, str(exc)))
    if count:
        wake()
    return done("ops.events.events", "replaying")
