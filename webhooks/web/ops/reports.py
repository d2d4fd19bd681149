"""The console's reports, suppression lists and audit log: the leads report of a range of days
grouped as the admin API's (a chart of the last 24 hours above it, a CSV of it beside it),
every suppression list with its users, and the newest changes of the audit log."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Any

from flask import Blueprint, Response, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import BadRequest, ValidationError
from webhooks.formats import validate
from webhooks.leads.accounting import reports
from webhooks.leads.rules.suppression import stored_ids
from webhooks.leads.rules.suppression import to_json as suppression_json
from webhooks.storage.live import keys
from webhooks.storage.records.models import Buyer, Publisher, SuppressionList
from webhooks.web.ops.console import NO_STORE, audit_rows, page
from webhooks.web.ops.page import chart

bp = Blueprint("reports", __name__)

SECTION = "ops.reports.reports"
AUDIT_SHOWN = 200


def _day(name: str, default: date) -> date:
    return validate.day("invalid_query", name, request.args.get(name) or default.isoformat())


def _range() -> tuple[date, date, str]:
    today = datetime.now(timezone.utc).date()
    first, last = _day("from", today - timedelta(days=6)), _day("to", today)
    if last < first or (last - first).days >= reports.MAX_DAYS:
        raise ValidationError("invalid_query", "to", f"must be on or after from, at most {reports.MAX_DAYS} days on")
    group_by = request.args.get("group_by") or "day"
    if group_by not in reports.GROUPS:
        raise ValidationError("invalid_query", "group_by", "must be one of " + ", ".join(reports.GROUPS))
    return first, last, group_by


@bp.get("/ops/reports", endpoint="reports")
def reports_page() -> ResponseReturnValue:
    """The report of `from`..`to` (the last 7 days by default) by `group_by` (day by default)."""
    context: dict[str, Any] = {"chart": chart(reports.last_hours(datetime.now(timezone.utc))), "groups": reports.GROUPS}
    try:
        first, last, group_by = _range()
    except BadRequest as exc:
        shown = {name: request.args.get(name, "") for name in ("from", "to", "group_by")}
        return page("reports.html", SECTION, 400, result=None, shown=shown, error=str(exc), **context)
    result = reports.as_json(reports.report(first, last, group_by))
    shown = {"from": first.isoformat(), "to": last.isoformat(), "group_by": group_by}
    return page("reports.html", SECTION, result=result, shown=shown, error=None, **context)


@bp.get("/ops/reports/leads.csv")
def reports_csv() -> ResponseReturnValue:
    """The report of the page's range as CSV (the admin API's own takes the bearer token,
    which a browser under the console's cookie has not)."""
    first, last, group_by = _range()
    name = f"leads-{group_by}-{first.isoformat()}-{last.isoformat()}.csv"
    headers = {"Content-Disposition": f'attachment; filename="{name}"', **NO_STORE}
    return Response(reports.as_csv(reports.report(first, last, group_by)), mimetype="text/csv", headers=headers)


@bp.get("/ops/audit")
def audit() -> ResponseReturnValue:
    """The newest rows of the audit log: every change made from here or the admin API, the
    settlements' repairs and conflicts; `?entity=` for one kind."""
    entity = request.args.get("entity") or None
    if entity is not None and (len(entity) > 32 or not entity.replace("_", "").isalnum()):
        entity = None
    return page("audit.html", "ops.reports.audit", rows=audit_rows(entity, limit=AUDIT_SHOWN), entity=entity or "")


@bp.get("/ops/suppression")
def suppression_lists() -> ResponseReturnValue:
    """Every suppression list: its field, hash and size, whether Redis holds all of it now, and
    the buyers and publishers that use it."""
    rows = list(SuppressionList.select().order_by(SuppressionList.id))
    r = services.current().store.redis
    pipe = r.pipeline(transaction=False)
    for row in rows:
        pipe.exists(keys.suppression_ready(row.id))
    ready = pipe.execute() if rows else []
    users: dict[str, list[str]] = {row.id: [] for row in rows}
    for buyer in Buyer.select(Buyer.id, Buyer.suppress).where(
        Buyer.deleted_at.is_null(), Buyer.suppress.is_null(False)
    ):
        for list_id in stored_ids(buyer.suppress):
            users.setdefault(list_id, []).append(f"buyer {buyer.id}")
    for publisher in Publisher.select(Publisher.id, Publisher.suppress).where(Publisher.suppress.is_null(False)):
        for list_id in stored_ids(publisher.suppress):
            users.setdefault(list_id, []).append(f"publisher {publisher.id}")
    lists = [
        {**suppression_json(row), "ready": bool(up), "users": users[row.id]}
        for row, up in zip(rows, ready, strict=True)
    ]
    return page("suppression.html", "ops.reports.suppression_lists", lists=lists)
