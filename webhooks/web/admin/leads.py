"""Admin routes of the lead ledger: read a lead, return a sale of it, decide a pending return,
erase its personal data, the leads report."""

from __future__ import annotations

from datetime import date

from flask import Blueprint, Response, jsonify, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import NotFound, ValidationError
from webhooks.formats import validate
from webhooks.formats.validate import is_id
from webhooks.leads.accounting import reports, return_service, returns
from webhooks.leads.accounting.erasure import Erasure, erase
from webhooks.leads.accounting.ledger import lead_view
from webhooks.web.http import json_body, query_arg

bp = Blueprint("leads", __name__)


def _publisher_id() -> str | None:
    publisher_id = query_arg("publisher_id")
    if publisher_id is not None and not is_id(publisher_id):
        raise NotFound("no such lead")
    return publisher_id


@bp.get("/leads/<id:lead_id>")
def get_lead(lead_id: str) -> ResponseReturnValue:
    return jsonify(lead_view(returns.find(lead_id, _publisher_id())))


@bp.delete("/leads/<id:lead_id>/personal-data")
def erase_lead_personal_data(lead_id: str) -> ResponseReturnValue:
    """Erase a settled lead's personal data everywhere (docs/api.md "Data kept per lead is
    bounded"): 200 with its record, whose sale, price and payout stay, once every web process
    and Redis' files hold none of it; 202 when one of them had not by ERASURE_WAIT_S (ask
    again); 404 / 409 ambiguous_lead_id as GET."""
    lead = returns.find(lead_id, _publisher_id())
    svc = services.current()
    reach = Erasure(
        store=svc.store,
        queue_redis=svc.queue_redis,
        forget_here=svc.journal.forget_bodies,
        journal_keep_s=svc.config.journal_keep_s,
        wait_s=svc.config.erasure_wait_s,
    )
    answer, done = erase(reach, lead)
    return jsonify(answer), 200 if done else 202


@bp.post("/leads/<id:lead_id>/return")
def return_lead(lead_id: str) -> ResponseReturnValue:
    """Return a sale of the lead under its buyer's policy: 200 with the lead's record and the
    return's id, or 202 {"return_id", "status": "return_pending"} when the buyer's returns are
    reviewed (docs/api.md "Sales")."""
    body = json_body() if request.get_data(cache=True) else {}
    if not isinstance(body, dict) or set(body) - {"reason", "buyer_id"}:
        raise ValidationError("invalid_return", "body", 'must be an object {"reason": "...", "buyer_id": "..."}')
    svc = services.current()
    done = return_service.return_now(
        svc.store,
        queue_redis=svc.queue_redis,
        queue=svc.queue,
        lead_id=lead_id,
        publisher_id=_publisher_id(),
        reason=body.get("reason"),
        buyer_id=body.get("buyer_id"),
    )
    return jsonify(done.record), 202 if done.pending else 200


@bp.post("/returns/<id:return_id>/approve")
def approve_return(return_id: str) -> ResponseReturnValue:
    """A pending return approved: its effects, once; 409 not_pending when it was decided."""
    return _decide(return_id, approve=True)


@bp.post("/returns/<id:return_id>/reject")
def reject_return(return_id: str) -> ResponseReturnValue:
    """A pending return rejected: the sale stands; 409 not_pending when it was decided."""
    return _decide(return_id, approve=False)


def _decide(return_id: str, *, approve: bool) -> ResponseReturnValue:
    svc = services.current()
    decided = return_service.decide_now(
        svc.store, queue_redis=svc.queue_redis, queue=svc.queue, return_id=return_id, approve=approve
    )
    return jsonify(decided)


def _day(name: str) -> date:
    return validate.day("invalid_query", name, query_arg(name) or "")


@bp.get("/reports/leads")
def leads_report() -> ResponseReturnValue:
    """The leads report (docs/api.md "Reports"): `from`, `to` (inclusive UTC days), `group_by`
    publisher, buyer, day or hour, `format` json (default) or csv."""
    first, last = _day("from"), _day("to")
    if last < first or (last - first).days >= reports.MAX_DAYS:
        raise ValidationError("invalid_query", "to", f"must be on or after from, at most {reports.MAX_DAYS} days on")
    group_by = query_arg("group_by") or "publisher"
    if group_by not in reports.GROUPS:
        raise ValidationError("invalid_query", "group_by", "must be one of " + ", ".join(reports.GROUPS))
    shape = query_arg("format") or "json"
    if shape not in ("json", "csv"):
        raise ValidationError("invalid_query", "format", "must be json or csv")
    result = reports.report(first, last, group_by)
    if shape == "csv":
        name = f"leads-{group_by}-{first.isoformat()}-{last.isoformat()}.csv"
        return Response(
            reports.as_csv(result),
            mimetype="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    return jsonify(reports.as_json(result))
