"""The console's reports, suppression lists and audit log: the leads report of a range of days
grouped as the admin API's (a chart of the last 24 hours above it, a CSV of it beside it),
every suppression list with its users and forms that make a list, add and remove its entries
and upload a file of them (through leads/rules/suppression.py, as the admin API: the same
normalisation, digests and audit rows), and the newest changes of the audit log."""

from __future__ import annotations

import csv
from datetime import date, datetime, timedelta, timezone
from typing import Any

from flask import Blueprint, Response, request
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import BadRequest, Conflict, ValidationError
from webhooks.formats import validate
from webhooks.leads.accounting import reports
from webhooks.leads.rules import suppression
from webhooks.leads.rules.catalog import bump_version
from webhooks.leads.rules.suppression import stored_ids
from webhooks.leads.rules.suppression import to_json as suppression_json
from webhooks.storage.live import keys
from webhooks.storage.records.models import Buyer, Publisher, SuppressionList
from webhooks.web.http import UPLOAD_FILE_BYTES
from webhooks.web.ops.console import NO_STORE, audit_rows, done, page, refusal
from webhooks.web.ops.page import chart

bp = Blueprint("reports", __name__)

SECTION = "ops.reports.reports"
AUDIT_SHOWN = 200
LISTS = "ops.reports.suppression_lists"
UPLOAD_MAX_LINES = 100_000  # of a file of entries (UPLOAD_FILE_BYTES bounds its size)
UPLOAD_MAX_CELL = 1_000  # characters of a line read: far above any e-mail (254) or phone
INVALID_SHOWN = 20  # the invalid lines a change names (each by its number, never its value)


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
    return _lists_page()


def _lists_page(
    status: int = 200, typed: dict[str, str] | None = None, errors: dict[str, str] | None = None
) -> ResponseReturnValue:
    """Every suppression list: its field, hash and size, whether Redis holds all of it now, and
    the buyers and publishers that use it; the form that makes one (as typed, with `errors`)."""
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
    return page(
        "suppression.html",
        LISTS,
        status,
        lists=lists,
        typed=typed or {"id": "", "field": "email", "hash": "sha256"},
        errors=errors or {},
        fields=suppression.FIELDS,
        hashes=suppression.HASHES,
    )


@bp.post("/ops/suppression")
def suppression_create() -> ResponseReturnValue:
    """Make a list from the form (`id`, `field`, `hash`): 303 to its page; the form again with
    every error beside its field (400), an id taken included (this form never changes a list)."""
    typed = {name: request.form.get(name, "").strip()[:100] for name in ("id", "field", "hash")}
    errors: dict[str, str] = {}
    if not validate.is_id(typed["id"]):
        errors["id"] = "must be 1 to 64 letters, digits, '.', '_' or '-'"
    elif SuppressionList.get_or_none(SuppressionList.id == typed["id"]) is not None:
        errors["id"] = "is taken: add to that list on its page"
    for name in ("field", "hash"):
        try:
            suppression.parse_list({"field": "email", "hash": "md5", name: typed[name]})
        except ValidationError as exc:
            errors[name] = refusal(exc)
    if errors:
        return _lists_page(400, typed, errors)
    svc = services.current()
    suppression.put_list(svc.store, typed["id"], typed["field"], typed["hash"], key=svc.config.suppression_key.encode())
    bump_version(svc.store.redis)  # the lead path's snapshot knows every list
    return done("ops.reports.suppression_list", "created", list_id=typed["id"])


def _list_page(
    row: SuppressionList, status: int = 200, result: dict[str, Any] | None = None, error: str | None = None
) -> ResponseReturnValue:
    """A list's page: its shape and size, the forms that change its entries, what the last
    change did (`result`) or why it did nothing (`error`), its audit rows."""
    ready = services.current().store.redis.exists(keys.suppression_ready(row.id))
    return page(
        "suppression_list.html",
        LISTS,
        status,
        item={**suppression_json(row), "ready": bool(ready)},
        result=result,
        error=error,
        max_entries=suppression.MAX_ENTRIES,
        max_upload_kib=UPLOAD_FILE_BYTES // 1024,
        max_lines=UPLOAD_MAX_LINES,
        audit=audit_rows("suppression_list", row.id, limit=20),
    )


@bp.get("/ops/suppression/<id:list_id>")
def suppression_list(list_id: str) -> ResponseReturnValue:
    return _list_page(suppression.get_list(list_id))


@bp.post("/ops/suppression/<id:list_id>/entries")
def suppression_entries(list_id: str) -> ResponseReturnValue:
    """Add the form's `add` values and remove its `remove` values (one a line, at most
    MAX_ENTRIES in all, as one API call): the page with what was added and removed, and the
    lines refused (by number) for what they are not."""
    row = suppression.get_list(list_id)
    add, remove = (_lines(request.form.get(name, "")) for name in ("add", "remove"))
    if len(add) + len(remove) > suppression.MAX_ENTRIES:
        error = f"at most {suppression.MAX_ENTRIES:,} values at once, added and removed together: upload a file"
        return _list_page(row, 400, error=error)
    return _changed(row, add, remove)


@bp.post("/ops/suppression/<id:list_id>/upload")
def suppression_upload(list_id: str) -> ResponseReturnValue:
    """Add every value of the uploaded `file` (text or CSV, a value a line, its first cell;
    UTF-8; at most UPLOAD_FILE_BYTES and UPLOAD_MAX_LINES): the page with the counts."""
    row = suppression.get_list(list_id)
    sent = request.files.get("file")
    if sent is None or not sent.filename:
        return _list_page(row, 400, error="choose a file to upload")
    data = sent.stream.read(UPLOAD_FILE_BYTES + 1)
    if len(data) > UPLOAD_FILE_BYTES:
        return _list_page(row, 413, error=f"the file is over {UPLOAD_FILE_BYTES // 1024:,} KiB: split it")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return _list_page(row, 400, error="the file is not UTF-8 text")
    lines = _lines(text)
    if len(lines) > UPLOAD_MAX_LINES:
        return _list_page(row, 413, error=f"the file has over {UPLOAD_MAX_LINES:,} lines: split it")
    return _changed(row, lines, [])


def _lines(text: str) -> list[tuple[int, str]]:
    """The values of a text, one a line, each with its line number: a CSV line's first cell
    (a file exported with a name beside each e-mail), blank lines left out."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            # A cell past UPLOAD_MAX_CELL can be no value: cut there (the entry check refuses it),
            # which also keeps the csv module under its field limit (131,072, else csv.Error).
            try:
                cells = next(csv.reader([line[:UPLOAD_MAX_CELL]]), [""])
            except csv.Error:  # a NUL byte, say: the line as typed, refused by the entry check
                cells = [line[:UPLOAD_MAX_CELL]]
            out.append((number, (cells[0] if cells else "").strip()))
    return out


def _changed(row: SuppressionList, add: list[tuple[int, str]], remove: list[tuple[int, str]]) -> ResponseReturnValue:
    """Apply the values through the API's own functions (suppression.change_values: each read
    as the API reads an entry, written in calls of at most MAX_ENTRIES with their audit rows);
    the page says what was read, added, removed and refused."""
    svc = services.current()
    try:
        rule = suppression.writable(row, svc.config.suppression_key.encode())
        done_ = suppression.change_values(svc.store, rule, add, remove)
    except Conflict as exc:
        return _list_page(suppression.get_list(row.id), exc.status, error=refusal(exc))
    result = {
        "read": len(add) + len(remove),
        "added": done_["added"],
        "removed": done_["removed"],
        "invalid": len(done_["invalid"]),
        "invalid_lines": done_["invalid"][:INVALID_SHOWN],
    }
    return _list_page(suppression.get_list(row.id), 200, result=result)
