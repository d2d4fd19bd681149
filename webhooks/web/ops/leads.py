"""The console's leads: the search (one box for an id, e-mail or phone; publisher and buyer
pick-lists, status, UTC days), its CSV and its bulk return, each lead's fields, routing trace
and return button, and the queue of returns awaiting review with approve and reject."""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, request, url_for
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import BadRequest, Conflict, NotFound
from webhooks.formats.validate import is_id
from webhooks.leads.accounting import return_service, returns, search
from webhooks.leads.accounting.ledger import ERASED, lead_view
from webhooks.storage.records.models import Buyer, Lead, Publisher
from webhooks.web.http import csv_response
from webhooks.web.listing import lead_page, lead_query
from webhooks.web.ops.console import audit_rows, done, page

bp = Blueprint("leads", __name__)

SECTION = "ops.leads.leads"
RETURNS = "ops.leads.returns_queue"
REVIEW_ACTIONS = ("return.requested", "return.rejected", "lead.returned")
FILTERS = ("q", "publisher_id", "buyer_id", "status", "since", "until")
PICK_MAX = 1_000  # ids a pick-list offers; past it the field is typed in
FIELD_VALUE = 2_000  # characters of a lead's field shown


def _pick(model: type[Buyer] | type[Publisher]) -> list[str] | None:
    """The ids a pick-list offers, in order; None when there are more than PICK_MAX."""
    ids = [row.id for row in model.select(model.id).order_by(model.id).limit(PICK_MAX + 1)]
    return None if len(ids) > PICK_MAX else ids


def _given() -> dict[str, Any]:
    """The search's filters the query string fills in (no cursor): the CSV's, each page's."""
    return {name: request.args[name] for name in FILTERS if request.args.get(name)}


def _search_page(status: int, **context: Any) -> ResponseReturnValue:
    cursor: dict[str, Any] = {"cursor": request.args["cursor"]} if request.args.get("cursor") else {}
    return page(
        "leads.html",
        SECTION,
        status,
        filters={name: request.args.get(name, "") for name in FILTERS},
        given=_given(),
        bulk_url=url_for("ops.leads.bulk_return", **_given(), **cursor),  # this page shown again after
        max_bulk=return_service.MAX_MANY,
        statuses=search.STATUSES,
        publishers=_pick(Publisher),
        buyers=_pick(Buyer),
        **context,
    )


@bp.get("/ops/leads")
def leads() -> ResponseReturnValue:
    """The lead search of GET /v1/admin/leads, newest first, with its filters as a form; a
    filter it cannot take is shown above the (empty) result, 400."""
    return _search()


def _search(results: list[return_service.OneReturn] | None = None, error: str | None = None) -> ResponseReturnValue:
    """The search's page (400 with `error`, or for a filter it cannot take); `results` what a
    bulk return did."""
    try:
        found = lead_page()
    except BadRequest as exc:
        return _search_page(400, items=[], error=str(exc), results=results)
    next_url = url_for("ops.leads.leads", cursor=found.next_cursor, **_given()) if found.next_cursor else None
    status = 200 if error is None else 400
    return _search_page(status, items=found.items, next_url=next_url, results=results, error=error)


@bp.get("/ops/leads.csv")
def leads_csv() -> ResponseReturnValue:
    """Every lead of the search as CSV (not a page: all of them, streamed a page at a time)."""
    try:
        query = lead_query()
    except BadRequest as exc:
        return _search_page(400, items=[], error=str(exc))
    return csv_response(search.as_csv(query), "leads.csv")


@bp.post("/ops/leads/return")
def bulk_return() -> ResponseReturnValue:
    """Return the ticked leads with one reason, each as its own return would (the sale to the
    searched buyer, when the search names one): the search again, with what happened to each;
    400 with the search for none ticked or more than return_service.MAX_MANY."""
    picked = list(dict.fromkeys(request.form.getlist("lead")))[: return_service.MAX_MANY + 1]
    named = [pair for pair in map(_pair, picked) if pair is not None]
    svc = services.current()
    try:
        results = return_service.return_many(
            svc.store,
            queue_redis=svc.queue_redis,
            queue=svc.queue,
            leads=named,
            reason=request.form.get("reason", "").strip() or None,
            buyer_id=request.args.get("buyer_id") or None,
        )
    except BadRequest as exc:
        return _search(None, str(exc))
    return _search(results)


def _pair(value: str) -> tuple[str, str] | None:
    """A ticked box's "publisher_id:lead_id" (ids hold no colon); None for anything else."""
    publisher_id, _, lead_id = value.partition(":")
    return (publisher_id, lead_id) if is_id(publisher_id) and is_id(lead_id) else None


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
    reason, and an approve and a reject button; of one buyer or publisher when picked."""
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
    picked = {name: request.args.get(name, "") for name in ("buyer_id", "publisher_id")}
    named = {name: value for name, value in picked.items() if is_id(value)}  # another value: no filter
    return page(
        "returns.html",
        RETURNS,
        status,
        returns=returns.pending(buyer_id=named.get("buyer_id"), publisher_id=named.get("publisher_id")),
        audit=decided,
        error=error,
        filters=picked,
        publishers=_pick(Publisher),
        buyers=_pick(Buyer),
    )


def _trace(row: Lead, error: str | None, status: int) -> ResponseReturnValue:
    audit = audit_rows("lead", f"{row.publisher_id}:{row.lead_id}")
    fields = _fields(row.payload)
    return page("lead.html", SECTION, status, lead=lead_view(row), fields=fields, audit=audit, error=error)


def _fields(payload: str) -> list[tuple[str, str]] | None:
    """A lead's fields as posted, (name, value) in order, a nested value as its JSON; None once
    its body is erased or purged. Shown escaped (Jinja's autoescape), long values cut."""
    if payload == ERASED:
        return None
    try:
        body = json.loads(payload)
    except ValueError:
        return [("body", _cut(payload))]
    if not isinstance(body, dict):
        return [("body", _cut(payload))]
    return [(str(name), _cut(value if isinstance(value, str) else json.dumps(value))) for name, value in body.items()]


def _cut(text: str) -> str:
    return text if len(text) <= FIELD_VALUE else text[:FIELD_VALUE] + "…"
