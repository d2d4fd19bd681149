"""The console's events: the endpoints with their backlog, forms that make an endpoint, edit it,
pause and resume it and give it a new secret (through events/endpoints.py, as PUT
/v1/admin/event-endpoints/<id>: the same checks and audit rows; a secret is shown once, on the
answer that made it), the deliveries given up on with a button that sends them again (`events
retry`), and a replay of an endpoint's events since a time (as POST .../replay)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from flask import Blueprint, request
from flask.typing import ResponseReturnValue
from werkzeug.datastructures import MultiDict

from webhooks import services
from webhooks.errors import BadRequest, Conflict, ValidationError
from webhooks.events import endpoints
from webhooks.events import log as events_log
from webhooks.events.outbox import EventType
from webhooks.formats import validate
from webhooks.storage.live import outbox_queue
from webhooks.storage.records.models import EventEndpoint
from webhooks.web.ops.console import audit_rows, done, page, refusal
from webhooks.web.ops.page import event_panel

bp = Blueprint("events", __name__)

SECTION = "ops.events.events"


def wake() -> None:
    svc = services.current()
    outbox_queue.wake(svc.queue_redis.redis, svc.queue)


TYPES = tuple(t.value for t in EventType)
PLACEHOLDER_URL = "https://example.com/"  # stands for the URL while another field is checked alone


def _events_page(
    status: int = 200,
    error: tuple[str, str] | None = None,
    new: dict[str, Any] | None = None,
    new_errors: dict[str, str] | None = None,
) -> ResponseReturnValue:
    """The page; `error` (endpoint id, message) beside that endpoint's replay; `new`, the form
    that makes an endpoint as typed, with `new_errors` beside its fields."""
    day_ago = (datetime.now(timezone.utc) - timedelta(days=1)).replace(microsecond=0).isoformat()
    audit = audit_rows("event_endpoint", limit=10) + audit_rows("event_dispatch", limit=10)
    audit.sort(key=lambda row: row["id"], reverse=True)
    return page(
        "events.html",
        SECTION,
        status,
        events=event_panel(),
        day_ago=day_ago,
        error=error,
        audit=audit,
        types=TYPES,
        new=new or {"types": [], "enabled": True},
        new_errors=new_errors or {},
    )


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


def _typed(form: MultiDict[str, str]) -> dict[str, Any]:
    """An endpoint's form as typed (what a refused form shows again, but a secret)."""
    return {
        "id": form.get("id", "").strip(),
        "url": form.get("url", "").strip(),
        "types": [t for t in form.getlist("types") if t in TYPES],
        "publisher_id": form.get("publisher_id", "").strip(),
        "enabled": "on" in form.getlist("enabled"),
    }


def _body(form: MultiDict[str, str], *, with_secret: bool, enabled: bool = True) -> dict[str, Any]:
    """The form as the admin API's PUT body: empty optional fields left out (their defaults:
    every type, every publisher's events, a secret made here); a form without the `enabled`
    box leaves it as `enabled` (the box is sent as an empty hidden value, then `on` if ticked)."""
    sent = form.getlist("enabled")
    body: dict[str, Any] = {"url": form.get("url", "").strip(), "enabled": "on" in sent if sent else enabled}
    if form.getlist("types"):
        body["types"] = form.getlist("types")
    if form.get("publisher_id", "").strip():
        body["publisher_id"] = form.get("publisher_id", "").strip()
    if with_secret and form.get("secret", "").strip():
        body["secret"] = form.get("secret", "").strip()
    return body


def _errors(body: dict[str, Any], stored: EventEndpoint | None) -> dict[str, str]:
    """Every field the API's own check refuses, each checked alone (the URL by a stand-in while
    another is), so that a form shows all its errors at once."""
    errors: dict[str, str] = {}
    for name in body:
        alone = {"url": body["url"]} if name == "url" else {"url": PLACEHOLDER_URL, name: body[name]}
        try:
            endpoints.parse(alone, stored if name == "url" else None)
        except ValidationError as exc:
            errors[exc.field or name] = refusal(exc)
    return errors


@bp.post("/ops/events/endpoints")
def endpoint_create() -> ResponseReturnValue:
    """Make an endpoint from the form (`id`, `url`, and optional `types`, `publisher_id`,
    `secret`, `enabled`): 201 its page with its secret shown once; the form again with every
    error beside its field (400), an id taken included."""
    form = request.form
    endpoint_id = form.get("id", "").strip()
    body = _body(form, with_secret=True)
    errors = _errors(body, None)
    if not validate.is_id(endpoint_id):
        errors["id"] = "must be 1 to 64 letters, digits, '.', '_' or '-'"
    elif EventEndpoint.get_or_none(EventEndpoint.id == endpoint_id) is not None:
        errors["id"] = "is taken: edit that endpoint instead"
    if not errors:
        try:
            row, _new_secret = endpoints.save(endpoint_id, body)
        except (ValidationError, Conflict) as exc:
            errors[getattr(exc, "field", "") or "id"] = refusal(exc)
        else:
            if row.enabled:
                wake()
            return _endpoint_page(row, 201, secret=row.secret)
    return _events_page(400, new=_typed(form), new_errors=errors)


def _endpoint_page(
    row: EventEndpoint,
    status: int = 200,
    *,
    secret: str | None = None,
    values: dict[str, Any] | None = None,
    errors: dict[str, str] | None = None,
) -> ResponseReturnValue:
    """An endpoint's page: its form (as saved, or `values` as typed with `errors`), its
    buttons, its audit rows; `secret` shown once when it was just made."""
    shown = endpoints.to_json(row)
    if values is None:
        values = {
            "url": shown["url"],
            "types": [] if row.types is None else shown["types"],
            "publisher_id": row.publisher_id or "",
            "enabled": bool(row.enabled),
        }
    return page(
        "event_endpoint.html",
        SECTION,
        status,
        endpoint=shown,
        values=values,
        errors={k: v for k, v in (errors or {}).items() if k != "_form"},
        refusal=(errors or {}).get("_form"),  # what refuses the whole change, above the form
        secret=secret,
        types=TYPES,
        audit=audit_rows("event_endpoint", row.id, limit=20),
    )


@bp.get("/ops/events/endpoints/<id:endpoint_id>")
def endpoint(endpoint_id: str) -> ResponseReturnValue:
    return _endpoint_page(endpoints.get(endpoint_id))


@bp.post("/ops/events/endpoints/<id:endpoint_id>")
def endpoint_edit(endpoint_id: str) -> ResponseReturnValue:
    """Save the form over the endpoint (its secret kept): 303 to its page, or the form again
    with every error beside its field (400; 409 for the PAYMENT_EVENTS_URL endpoint)."""
    row = endpoints.get(endpoint_id)  # 404 for no such endpoint
    body = _body(request.form, with_secret=False, enabled=bool(row.enabled))
    errors = _errors(body, row)
    status = 400
    if not errors:
        try:
            saved, _new_secret = endpoints.save(endpoint_id, body)
        except ValidationError as exc:
            errors[exc.field or "url"] = refusal(exc)
        except Conflict as exc:
            errors["_form"], status = refusal(exc), exc.status
        else:
            if saved.enabled:
                wake()  # enabled again: what it kept is due now
            return done("ops.events.endpoint", "saved", endpoint_id=endpoint_id)
    return _endpoint_page(row, status, values=_typed(request.form), errors=errors)


@bp.post("/ops/events/endpoints/<id:endpoint_id>/pause")
def endpoint_pause(endpoint_id: str) -> ResponseReturnValue:
    """Pause the endpoint: its events are kept, not sent."""
    endpoints.set_enabled(endpoint_id, False)
    return done("ops.events.endpoint", "paused", endpoint_id=endpoint_id)


@bp.post("/ops/events/endpoints/<id:endpoint_id>/resume")
def endpoint_resume(endpoint_id: str) -> ResponseReturnValue:
    """Enable the endpoint again: what it kept is sent, in order."""
    endpoints.set_enabled(endpoint_id, True)
    wake()
    return done("ops.events.endpoint", "resumed", endpoint_id=endpoint_id)


@bp.post("/ops/events/endpoints/<id:endpoint_id>/rotate")
def endpoint_rotate(endpoint_id: str) -> ResponseReturnValue:
    """Give the endpoint a new secret, as a PUT of the endpoint as GET shows it with a new
    `secret` would: the new one shown once on the answer; events from now on are signed with
    it. 409 for the PAYMENT_EVENTS_URL endpoint (its secret is configuration)."""
    row = endpoints.get(endpoint_id)
    shown = endpoints.to_json(row)
    body = {
        "url": shown["url"],  # as GET shows it: the stored URL is kept
        "types": None if row.types is None else shown["types"],
        "publisher_id": row.publisher_id,
        "enabled": bool(row.enabled),
        "secret": endpoints.generate_secret(),
    }
    try:
        saved, _new_secret = endpoints.save(endpoint_id, body)
    except Conflict as exc:
        return _endpoint_page(row, exc.status, errors={"_form": refusal(exc)})
    return _endpoint_page(saved, secret=saved.secret)
