"""What every page of the operator console shares: rendering with the navigation, the answer
to a form (303 back to a page, with a notice from a fixed list: nothing a request sends is
shown back as a notice), a refused form shown again, and the audit log's rows."""

from __future__ import annotations

from typing import Any

from flask import Flask, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from webhooks.errors import FloodgateError, ValidationError
from webhooks.people import roles
from webhooks.storage.records.models import AuditLog
from webhooks.web.sessions import form_token

NO_STORE = {"Cache-Control": "no-store"}
AUDIT_DETAIL = 400  # characters of a row's detail shown

# ?notice= after a change: the page says which, from this list only.
NOTICES = {
    "created": "Created.",
    "saved": "Saved.",
    "paused": "Paused: no lead is offered until it is resumed.",
    "resumed": "Resumed.",
    "returned": "Returned: the buyer is refunded and the publisher's payout reversed.",
    "return_pending": "Return asked: it awaits review under Returns.",
    "approved": "Approved: the sale is returned, the buyer refunded and the publisher's payout reversed.",
    "rejected": "Rejected: the sale stands.",
    "assigned": "Assigned: the wallet is credited and the application told.",
    "retried": "Failed deliveries are being sent again, in order.",
    "replaying": "Replaying: the endpoint's events are being sent again with their webhook-ids.",
}


def init_app(app: Flask) -> None:
    """What every template of the console sees: csrf_token(), get_flashed() and read_only()."""
    app.add_template_global(form_token, "csrf_token")  # a global: imported macros see it too
    app.context_processor(_console_helpers)


def _console_helpers() -> dict[str, Any]:
    return {"get_flashed": _notices, "read_only": _read_only}


def _read_only() -> bool:
    """Whether this page's user may change nothing (an analyst): its change forms are not
    offered. The server's role check (webhooks/people/roles.py) refuses them all the same."""
    user = g.get("ops_user")
    return user is not None and not roles.may_change(user.role)


def _notices() -> list[tuple[str, str]]:
    notice = NOTICES.get(request.args.get("notice", ""))
    return [("", notice)] if notice else []


def page(template: str, section: str, status: int = 200, **context: Any) -> tuple[str, int, dict[str, str]]:
    """A console page, never cached (it shows live figures and carries the session's form token)."""
    return render_template(template, section=section, **context), status, NO_STORE


def refusal(exc: FloodgateError) -> str:
    """What a refusal says on a form: a field's problem without the field's name (the form
    shows it beside that field), any other refusal's message whole."""
    return exc.problem if isinstance(exc, ValidationError) else exc.message


def done(endpoint: str, notice: str, **values: Any) -> Response:
    """303 to a page after a change, which the page then names."""
    assert notice in NOTICES
    return redirect(url_for(endpoint, **values, notice=notice), code=303)


def audit_rows(entity: str | None = None, entity_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """The newest rows of the audit log, of one entity when named (the (entity, entity_id) index)."""
    query = AuditLog.select()
    if entity is not None:
        query = query.where(AuditLog.entity == entity)
    if entity_id is not None:
        query = query.where(AuditLog.entity_id == entity_id)
    return [
        {
            "id": row.id,
            "at": row.at.isoformat(sep=" ", timespec="seconds"),
            "actor": row.actor,
            "action": row.action,
            "entity": row.entity,
            "entity_id": row.entity_id,
            "detail": None if row.detail is None else _cut(row.detail),
        }
        for row in query.order_by(AuditLog.id.desc()).limit(limit)
    ]


def _cut(text: str) -> str:
    return text if len(text) <= AUDIT_DETAIL else text[:AUDIT_DETAIL] + "…"
