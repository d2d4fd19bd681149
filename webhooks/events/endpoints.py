"""The applications' endpoints (docs/api.md "Event endpoints"): where events go, which ones, signed
with which secret, and whether they are sent now.

`enabled: false` pauses an endpoint: fan-out still writes its dispatches (pausing stops
sending, never writing) and enabling it again makes every one of them due at once, failed ones
included, so that they drain in order. The worker disables an endpoint the same way when it has
been failing for EVENT_ENDPOINT_DISABLE_AFTER_S (`disabled_reason: failing`).

The endpoint PAYMENT_EVENTS_URL configures is the row MANAGED_ID, kept in step with the
configuration by the worker (`sync_managed`); the admin API shows it and may pause or replay it
but not change or delete it.
"""

from __future__ import annotations

import base64
import json
import secrets as random_secrets
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import peewee as pw

from webhooks.errors import Conflict, NotFound, ValidationError
from webhooks.events.outbox import LEAD_TYPES, PUBLISHER_DEFAULT_TYPES, WALLET_TYPES, EventType
from webhooks.formats import validate as v
from webhooks.logs import REDACTED_URL, redact_secret, redact_url, restore_url
from webhooks.storage.records import audit
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, db, is_mysql
from webhooks.storage.records.models import EventDispatch, EventEndpoint, utcnow

CODE = "invalid_endpoint"
MANAGED_ID = "payment-events-url"  # the endpoint PAYMENT_EVENTS_URL configures
PAUSED, FAILING = "paused", "failing"  # why an endpoint is disabled
_FIELDS = {"url", "types", "publisher_id", "secret", "enabled"}
_READ_ONLY = {"id", "managed", "disabled_reason", "disabled_at", "last_error", "created_at", "updated_at"}
MAX_ENDPOINTS = 1000  # endpoints are admin-made, and each costs every event a dispatch row
SECRET_PREFIX = "whsec_"


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """An endpoint as the sending engine (sender.py) uses it."""

    id: str
    url: str
    types: frozenset[str] | None  # None: every type
    publisher_id: str | None
    secrets: tuple[str, ...]  # () for the managed endpoint while PAYMENT_EVENTS_SECRET is unset
    enabled: bool
    failing_since: datetime | None

    @property
    def sendable(self) -> bool:
        """Enabled, and able to sign (the managed endpoint needs PAYMENT_EVENTS_SECRET)."""
        return self.enabled and bool(self.secrets)

    def wants(self, event_type: str, publisher_id: str | None) -> bool:
        """Whether an event of `event_type` (of `publisher_id`'s lead) goes to this endpoint."""
        if self.types is not None and event_type not in self.types:
            return False
        return self.publisher_id is None or self.publisher_id == publisher_id


def generate_secret() -> str:
    """A Standard Webhooks secret: whsec_ and the base64 of 24 random bytes (192 bits)."""
    return SECRET_PREFIX + base64.b64encode(random_secrets.token_bytes(24)).decode()


def _secret(value: Any) -> str:
    secret = v.text(CODE, "secret", value, max_len=200)
    key = secret.removeprefix(SECRET_PREFIX)
    try:
        raw = base64.b64decode(key, validate=True)
    except ValueError:
        raise ValidationError(CODE, "secret", "must be whsec_ followed by the base64 of the key") from None
    if not secret.startswith(SECRET_PREFIX) or not 24 <= len(raw) <= 64:
        raise ValidationError(CODE, "secret", "must be whsec_ followed by the base64 of a 24 to 64 byte key")
    return secret


def _types(value: Any) -> list[str] | None:
    if value is None:
        return None
    known = [t.value for t in EventType]
    if not isinstance(value, list) or not value or len(value) > len(known):
        raise ValidationError(CODE, "types", f"must be a non-empty list of event types: {', '.join(known)}")
    for t in value:
        if t not in known:
            raise ValidationError(CODE, "types", f"{t!r} is not an event type ({', '.join(known)})")
    return sorted(set(value), key=known.index)


def parse(body: Any, stored: EventEndpoint | None) -> dict[str, Any]:
    """Validate an admin PUT body; return the columns of the EventEndpoint row. The secret is
    kept when absent (or sent back as GET shows it) and generated for a new endpoint."""
    body = v.fields(CODE, body, _FIELDS, _READ_ONLY, ("url",))
    types = _types(body.get("types"))
    publisher_id = body.get("publisher_id")
    if publisher_id is not None:
        if not v.is_id(publisher_id):
            raise ValidationError(CODE, "publisher_id", "must be a publisher id")
        if types is not None and any(t not in LEAD_TYPES for t in types):
            raise ValidationError(CODE, "types", "a publisher's endpoint gets lead events only")
        types = types or [t.value for t in PUBLISHER_DEFAULT_TYPES]
    given = body.get("secret")
    if given is None or (stored is not None and stored.secret and given == redact_secret(stored.secret)):
        secret = stored.secret if stored is not None and stored.secret else generate_secret()
    else:
        secret = _secret(given)
    return {
        "url": v.http_url(CODE, "url", _restored(body["url"], stored)),
        "types": None if types is None else json.dumps(types),
        "publisher_id": publisher_id,
        "secret": secret,
        "enabled": v.boolean(CODE, "enabled", body.get("enabled", True)),
    }


def _restored(url: Any, stored: EventEndpoint | None) -> Any:
    """The URL as GET shows it (secret query values redacted) sent back keeps the stored one."""
    if not isinstance(url, str):
        return url
    restored = restore_url(url, None if stored is None else stored.url)
    if restored is None:
        raise ValidationError(CODE, "url", REDACTED_URL)
    return restored


def to_json(row: EventEndpoint, show_secret: bool = False) -> dict[str, Any]:
    """An endpoint as the admin API shows it: the secret in full only when `show_secret` (the
    answer to the PUT that made it), else its last 4 characters."""
    secret = row.secret
    return {
        "id": row.id,
        "url": redact_url(row.url),
        "types": json.loads(row.types) if row.types else [t.value for t in EventType],
        "publisher_id": row.publisher_id,
        "secret": None if not secret else secret if show_secret else redact_secret(secret),
        "enabled": bool(row.enabled),
        "disabled_reason": row.disabled_reason,
        "disabled_at": _iso(row.disabled_at),
        "last_error": row.last_error,
        "managed": row.id == MANAGED_ID,  # PAYMENT_EVENTS_URL: changed by configuration only
        "created_at": _iso(row.created_at),
        "updated_at": _iso(row.updated_at),
    }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat() + "Z"


def get(endpoint_id: str) -> EventEndpoint:
    row = EventEndpoint.get_or_none(EventEndpoint.id == endpoint_id)
    if row is None:
        raise NotFound(f"no event endpoint {endpoint_id!r}")
    return row


def _locked(query: pw.ModelSelect[EventEndpoint]) -> pw.ModelSelect[EventEndpoint]:
    """The row locked for the transaction (SQLite has no FOR UPDATE: its writers take turns)."""
    return query.for_update() if is_mysql() else query


def _refuse_managed(endpoint_id: str) -> None:
    if endpoint_id == MANAGED_ID:
        raise Conflict("this endpoint is PAYMENT_EVENTS_URL's: change it in the configuration", code="managed_endpoint")


def save(endpoint_id: str, body: Any) -> tuple[EventEndpoint, bool]:
    """Create or replace an endpoint; (row, whether its secret is new and so shown once). The
    managed endpoint takes `enabled` only (what else is sent must be what it has)."""
    if endpoint_id == MANAGED_ID:
        return _save_managed(body), False
    now = utcnow()
    with db.atomic():
        stored = _locked(EventEndpoint.select().where(EventEndpoint.id == endpoint_id)).first()
        fields = parse(body, stored)
        if stored is None:
            if EventEndpoint.select().count() >= MAX_ENDPOINTS:
                raise Conflict(f"at most {MAX_ENDPOINTS} event endpoints", code="too_many_endpoints")
            EventEndpoint.create(
                id=endpoint_id,
                **fields,
                disabled_reason=None if fields["enabled"] else PAUSED,
                disabled_at=None if fields["enabled"] else now,
                created_at=now,
                updated_at=now,
            )
        else:
            EventEndpoint.update(**fields, updated_at=now).where(EventEndpoint.id == endpoint_id).execute()
            _switch(stored, fields["enabled"], now)
        detail = {k: redact_url(val) if k == "url" else val for k, val in fields.items() if k != "secret"}
        audit.record("admin", "event_endpoint.put", "event_endpoint", endpoint_id, detail)
    new_secret = stored is None or stored.secret != fields["secret"]
    return EventEndpoint.get_by_id(endpoint_id), new_secret


def _save_managed(body: Any) -> EventEndpoint:
    stored = get(MANAGED_ID)
    body = v.fields(CODE, body, _FIELDS, _READ_ONLY, ())
    shown = to_json(stored)
    for name in ("url", "types", "publisher_id", "secret"):
        if name in body and body[name] != shown[name] and not (name == "url" and body[name] == stored.url):
            _refuse_managed(MANAGED_ID)  # (its url, as GET shows it or in full, is not a change)
    if "enabled" in body:
        return set_enabled(MANAGED_ID, v.boolean(CODE, "enabled", body["enabled"]))
    return stored


def set_enabled(endpoint_id: str, enabled: bool) -> EventEndpoint:
    """Pause or resume an endpoint (the managed one included)."""
    now = utcnow()
    with db.atomic():
        stored = _locked(EventEndpoint.select().where(EventEndpoint.id == endpoint_id)).first()
        if stored is None:
            raise NotFound(f"no event endpoint {endpoint_id!r}")
        EventEndpoint.update(enabled=enabled, updated_at=now).where(EventEndpoint.id == endpoint_id).execute()
        _switch(stored, enabled, now)
        audit.record(
            "admin", "event_endpoint.enabled" if enabled else "event_endpoint.paused", "event_endpoint", endpoint_id
        )
    return EventEndpoint.get_by_id(endpoint_id)


def _switch(stored: EventEndpoint, enabled: bool, now: datetime) -> None:
    """The state change of a PUT: pausing records why; enabling makes every kept dispatch due
    now (failed ones get a new round of attempts), so they drain in order from the oldest."""
    if enabled == bool(stored.enabled):
        return
    if not enabled:
        EventEndpoint.update(disabled_reason=PAUSED, disabled_at=now).where(EventEndpoint.id == stored.id).execute()
        return
    EventEndpoint.update(disabled_reason=None, disabled_at=None, failing_since=None).where(
        EventEndpoint.id == stored.id
    ).execute()
    EventDispatch.update(status="pending", next_attempt_at=now, first_attempt_at=None).where(
        EventDispatch.endpoint_id == stored.id, EventDispatch.status.in_(["pending", "failed"])
    ).execute()


def delete(endpoint_id: str) -> None:
    """Remove an endpoint and the dispatches it had not received (its delivered ones stay, for
    the events log)."""
    _refuse_managed(endpoint_id)
    with db.atomic():
        if not EventEndpoint.delete().where(EventEndpoint.id == endpoint_id).execute():
            raise NotFound(f"no event endpoint {endpoint_id!r}")
        EventDispatch.delete().where(
            EventDispatch.endpoint_id == endpoint_id, EventDispatch.status != "delivered"
        ).execute()
        audit.record("admin", "event_endpoint.delete", "event_endpoint", endpoint_id)


def listing() -> list[EventEndpoint]:
    return list(EventEndpoint.select().order_by(EventEndpoint.id))


def sync_managed(url: str, secrets: tuple[str, ...]) -> None:
    """Make the managed endpoint's row agree with PAYMENT_EVENTS_URL (the worker, each drain).
    Unset: the row stays as it was, and its dispatches wait until it is set again."""
    if not url:
        return
    now = utcnow()
    types = json.dumps([t.value for t in WALLET_TYPES])
    with db.atomic():
        if (
            not EventEndpoint.update(url=url, types=types, secret=None)
            .where(
                EventEndpoint.id == MANAGED_ID,
                (EventEndpoint.url != url) | EventEndpoint.types.is_null() | (EventEndpoint.types != types),
            )
            .execute()
        ):
            EventEndpoint.insert(
                id=MANAGED_ID, url=url, types=types, secret=None, enabled=True, created_at=now, updated_at=now
            ).on_conflict_ignore().execute()


class Listening:
    """Whether any endpoint may want an event now, for the web process deciding whether a
    commit needs to wake the worker: always while PAYMENT_EVENTS_URL is set, else whether an
    enabled endpoint exists, read at most every `ttl_s`. A wake it skips costs nothing but
    time: the event is in the database, and the sweep fans it out within seconds (to nobody,
    when nobody listens)."""

    def __init__(self, configured: bool, ttl_s: float = 1.0):
        self.configured, self.ttl_s = configured, ttl_s
        self.value, self.until = True, 0.0

    def __call__(self) -> bool:
        if self.configured:
            return True
        now = time.monotonic()
        if now >= self.until:
            try:
                self.value = EventEndpoint.select().where(EventEndpoint.enabled == True).exists()  # noqa: E712
            except UNAVAILABLE_ERRORS:
                self.value = True  # not known: wake
            self.until = now + self.ttl_s
        return self.value


def active(managed_secrets: tuple[str, ...]) -> list[Endpoint]:
    """Every endpoint, as the engine uses it (the managed one signs with `managed_secrets`)."""
    return [
        Endpoint(
            id=row.id,
            url=row.url,
            types=frozenset(json.loads(row.types)) if row.types else None,
            publisher_id=row.publisher_id,
            secrets=(row.secret,) if row.secret else managed_secrets,
            enabled=bool(row.enabled),
            failing_since=row.failing_since,
        )
        for row in EventEndpoint.select()
    ]
