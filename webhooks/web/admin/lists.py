"""Admin lists (docs/api.md "Lists, partial updates and the operator console"): buyers,
publishers and the lead search, a page at a time: `{"items": [...], "next_cursor": null |
"<opaque>"}`, `?limit=` 1-500 (default 100), `?cursor=` the last page's `next_cursor`.

Each item is what the single GET shows, its Redis parts (cap usage, breaker, balance) among
them, read for the whole page in one round trip each (and the page's wallets in one query)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import jsonify, request
from flask.typing import ResponseReturnValue

from webhooks.errors import ValidationError
from webhooks.leads.accounting import search
from webhooks.leads.accounting.search import BadCursor, LeadQuery, decode_cursor, encode_cursor
from webhooks.storage.models import Buyer, Publisher
from webhooks.validate import is_id
from webhooks.web.admin import bp
from webhooks.web.admin import buyers as admin_buyers
from webhooks.web.admin import publishers as admin_publishers


def _limit() -> int:
    raw = request.args.get("limit")
    if raw is None:
        return search.DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= search.MAX_LIMIT:
        raise ValidationError("invalid_query", "limit", f"must be an integer from 1 to {search.MAX_LIMIT}")
    return int(raw)


def _cursor() -> str | None:
    return request.args.get("cursor")


def _bad_cursor() -> ValidationError:
    return ValidationError("invalid_query", "cursor", "must be a next_cursor this list returned")


def _after_id() -> str | None:
    """The id a buyers' or publishers' page starts after."""
    cursor = _cursor()
    if cursor is None:
        return None
    try:
        key = decode_cursor(cursor)
    except BadCursor:
        raise _bad_cursor() from None
    if len(key) != 1 or not isinstance(key[0], str) or not is_id(key[0]):
        raise _bad_cursor()
    return str(key[0])


def _page(items: list[dict[str, Any]], rows: list[Any], limit: int) -> ResponseReturnValue:
    next_cursor = encode_cursor([rows[limit - 1].id]) if len(rows) > limit else None
    return jsonify({"items": items, "next_cursor": next_cursor})


@bp.get("/buyers")
def list_buyers() -> ResponseReturnValue:
    """Buyers not deleted, by id, each as GET /v1/admin/buyers/<id> shows it."""
    limit, after = _limit(), _after_id()
    select = Buyer.select().where(Buyer.deleted_at.is_null())
    if after is not None:
        select = select.where(Buyer.id > after)
    rows = list(select.order_by(Buyer.id).limit(limit + 1))
    items = admin_buyers.shown(rows[:limit])
    return _page(items, rows, limit)


@bp.get("/publishers")
def list_publishers() -> ResponseReturnValue:
    """Publishers, by id, each as GET /v1/admin/publishers/<id> shows it."""
    limit, after = _limit(), _after_id()
    select = Publisher.select()
    if after is not None:
        select = select.where(Publisher.id > after)
    rows = list(select.order_by(Publisher.id).limit(limit + 1))
    return _page(admin_publishers.shown(rows[:limit]), rows, limit)


def _id_arg(name: str) -> str | None:
    value = request.args.get(name)
    if value is not None and not is_id(value):
        raise ValidationError("invalid_query", name, "must be an id")
    return value


def _instant(name: str) -> datetime | None:
    raw = request.args.get(name)
    if raw is None:
        return None
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise ValidationError("invalid_query", name, "must be an ISO 8601 instant with an offset")
    return at


def _status() -> str | None:
    status = request.args.get("status")
    if status is not None and status not in search.STATUSES:
        raise ValidationError("invalid_query", "status", "must be one of " + ", ".join(search.STATUSES))
    return status


@bp.get("/leads")
def search_leads() -> ResponseReturnValue:
    """The ledger's leads, newest first (received_at, then the row), filtered by publisher_id,
    buyer_id, status (the ledger's: sold, unsold, returned, test_sold, test_unsold), since
    (inclusive) and until (exclusive); each as GET /v1/admin/leads/<id> shows it."""
    query = LeadQuery(
        publisher_id=_id_arg("publisher_id"),
        buyer_id=_id_arg("buyer_id"),
        status=_status(),
        since=_instant("since"),
        until=_instant("until"),
    )
    limit = _limit()
    try:
        page = search.search(query, limit=limit, cursor=_cursor())
    except BadCursor:
        raise _bad_cursor() from None
    return jsonify({"items": page.items, "next_cursor": page.next_cursor})
