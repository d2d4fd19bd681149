"""The console's leads: the search (publisher, buyer, status, time), each lead's routing trace
and its return button, and the queue of returns awaiting review with approve and reject."""

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
RETURNS = "ops.leads.returns_queue"
REVIEW_ACTIONS = ("return.requested", "return.rejected", "lead.returned")
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
    buyer_id = request.form.get("buyer_id", "").strip() or None
    try:
        svc = services.current()
        made = return_service.return_now(
            svc.store,
            queue_redis=svc.queue_redis,
            queue=svc.queue,
            lead_id=lead_id,
            publisher_id=publisher_id,
            reason=reason,
            buyer_id=buyer_id,
        )
    except (BadRequest, Conflict, NotFound) as exc:
        return _trace(returns.find(lead_id, publisher_id), str(exc), exc.status)
    row = returns.find(lead_id, publisher_id)
    notice = "return_pending" if made.pending else "returned"
    return done("ops.leads.lead", notice, lead_id=lead_id, publisher_id=row.publisher_id)


@bp.get("/ops/returns")
def returns_queue() -> ResponseReturnValue:
    """Returns awaiting review, oldest first, each with its lead, buyer, price and the buyer's
    reason, and an approve and a reject button."""
    return _queue(None, 200)


@bp.post("/ops/returns/<id:return_id>/approve")
def return_approve(return_id: str) -> ResponseReturnValue:
    """Approve a pending return (its effects, once): 303 back to the queue, or the queue with
    why not (404, 409 when it was decided already)."""
    return _decide(return_id, approve=True)


@bp.post("/ops/returns/<id:return_id>/reject")
def return_reject(return_id: str) -> ResponseReturnValue:
    """Reject a pending return (the sale stands): 303 back to the queue, or the queue with why not."""
    return _decide(return_id, approve=False)


def _decide(return_id: str, *, approve: bool) -> ResponseReturnValue:
    svc = services.current()
    try:
        return_service.decide_now(
            svc.store, queue_redis=svc.queue_redis, queue=svc.queue, return_id=return_id, approve=approve
        )
    except (Conflict, NotFound) as exc:
        return _queue(str(exc), exc.status)
    return done("ops.leads.returns_queue", "approved" if approve else "rejected")


def _queue(error: str | None, status: int) -> ResponseReturnValue:
    decided = [r for r in audit_rows("lead", limit=200) if r["action"] in REVIEW_ACTIONS][:50]
    return page("returns.html", RETURNS, status, returns=returns.pending(), audit=decided, error=error)


def _trace(row: Lead, error: str | None, status: int) -> ResponseReturnValue:
    audit = audit_rows("lead", f"{row.publisher_id}:{row.lead_id}")
    return page("lead.html", SECTION, status, lead=lead_view(row), audit=audit, error=error)
