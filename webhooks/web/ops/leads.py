"""The console's leads: the search (publisher, buyer, status, time), each lead's routing trace
and its return button."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, request, url_for
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import BadRequest, Conflict, NotFound
from webhooks.formats.validate import is_id
from webhooks.leads.accounting import return_service, returns, search
from webhooks.leads.accounting.ledger import lead_view
from webhooks.storage.records.models import Lead
from webhooks.web.listing import lead_page
from webhooks.web.ops.console import audit_rows, done, page

bp = Blueprint("leads", __name__)

SECTION = "ops.leads.leads"
FILTERS = ("publisher_id", "buyer_id", "status", "since", "until")


@bp.get("/ops/leads")
def leads() -> ResponseReturnValue:
    """The lead search of GET /v1/admin/leads, newest first, with its filters as a form; a
    filter it cannot take is shown above the (empty) result, 400."""
    filters = {name: request.args.get(name, "") for name in FILTERS}
    try:
        found = lead_page()
    except BadRequest as exc:
        return page("leads.html", SECTION, 400, filters=filters, statuses=search.STATUSES, items=[], error=str(exc))
    given: dict[str, Any] = {name: value for name, value in filters.items() if value}
    next_url = url_for("ops.leads.leads", cursor=found.next_cursor, **given) if found.next_cursor else None
    return page("leads.html", SECTION, filters=filters, statuses=search.STATUSES, items=found.items, next_url=next_url)


def _publisher_id() -> str | None:
    publisher_id = request.values.get("publisher_id") or None
    if publisher_id is not None and not is_id(publisher_id):
        raise NotFound("no such lead")
    return publisher_id


@bp.get("/ops/leads/<id:lead_id>")
def lead(lead_id: str) -> ResponseReturnValue:
    """A lead's trace: every buyer offered it and how each answered, the ones skipped and why,
    its sale and payout; `?publisher_id=` when two publishers used the same lead id."""
    return _trace(returns.find(lead_id, _publisher_id()), None, 200)


@bp.post("/ops/leads/<id:lead_id>/return")
def lead_return(lead_id: str) -> ResponseReturnValue:
    """Return a sold lead with the form's reason: 303 to its trace, or the trace again with
    why not (400 or 409)."""
    publisher_id = _publisher_id()
    reason = request.form.get("reason", "").strip() or None
    try:
        svc = services.current()
        return_service.return_now(
            svc.store,
            queue_redis=svc.queue_redis,
            queue=svc.queue,
            lead_id=lead_id,
            publisher_id=publisher_id,
            reason=reason,
        )
    except (BadRequest, Conflict) as exc:
        return _trace(returns.find(lead_id, publisher_id), str(exc), exc.status)
    row = returns.find(lead_id, publisher_id)
    return done("ops.leads.lead", "returned", lead_id=lead_id, publisher_id=row.publisher_id)


def _trace(row: Lead, error: str | None, status: int) -> ResponseReturnValue:
    audit = audit_rows("lead", f"{row.publisher_id}:{row.lead_id}")
    return page("lead.html", SECTION, status, lead=lead_view(row), audit=audit, error=error)
