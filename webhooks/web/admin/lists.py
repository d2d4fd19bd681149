"""Admin lists (docs/api.md "Lists, partial updates and the operator console"): buyers,
publishers and the lead search, a page at a time: `{"items": [...], "next_cursor": null |
"<opaque>"}`, `?limit=` 1-500 (default 100), `?cursor=` the last page's `next_cursor`.

Each item is what the single GET shows, its Redis parts (cap usage, breaker, balance) among
them, read for the whole page in one round trip each (and the page's wallets in one query)."""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

import peewee as pw
from flask import jsonify
from flask.typing import ResponseReturnValue

from webhooks.errors import ValidationError
from webhooks.formats.validate import instant, is_id
from webhooks.leads.accounting import search
from webhooks.leads.accounting.search import BadCursor, LeadQuery, decode_cursor, encode_cursor
from webhooks.storage.records.models import Buyer, Publisher
from webhooks.web.admin import bp
from webhooks.web.admin import buyers as admin_buyers
from webhooks.web.admin import publishers as admin_publishers
from webhooks.web.http import query_arg

M = TypeVar("M", bound=pw.Model)


def _limit() -> int:
    raw = query_arg("limit")
    if raw is None:
        return search.DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= search.MAX_LIMIT:
        raise ValidationError("invalid_query", "limit", f"must be an integer from 1 to {search.MAX_LIMIT}")
    return int(raw)


def _cursor() -> str | None:
    return query_arg("cursor")


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


def page_of(select: pw.ModelSelect[M], key: pw.Field) -> tuple[list[M], str | None]:
    """A page of `select` in order of its unique `key` (an id), from `?cursor=` for `?limit=`
    rows: the rows and the cursor of the next page (None on the last)."""
    limit, after = _limit(), _after_id()
    if after is not None:
        select = select.where(key > after)
    rows = list(select.order_by(key).limit(limit + 1))
    return rows[:limit], encode_cursor([getattr(rows[limit - 1], key.name)]) if len(rows) > limit else None


@bp.get("/buyers")
def list_buyers() -> ResponseReturnValue:
    """Buyers not deleted, by id, each as GET /v1/admin/buyers/<id> shows it."""
    rows, next_cursor = page_of(Buyer.select().where(Buyer.deleted_at.is_null()), Buyer.id)
    return jsonify({"items": admin_buyers.shown(rows), "next_cursor": next_cursor})


@bp.get("/publishers")
def list_publishers() -> ResponseReturnValue:
    """Publishers, by id, each as GET /v1/admin/publishers/<id> shows it."""
    rows, next_cursor = page_of(Publisher.select(), Publisher.id)
    return jsonify({"items": admin_publishers.shown(rows), "next_cursor": next_cursor})


def _id_arg(name: str) -> str | None:
    value = query_arg(name)
    if value is not None and not is_id(value):
        raise ValidationError("invalid_query", name, "must be an id")
    return value


def _instant(name: str) -> datetime | None:
    raw = query_arg(name)
    if raw is None:
        return None
    problem = "must be an ISO 8601 instant with an offset"
    return instant("invalid_query", name, raw, problem=problem, offset_required=True)


def _status() -> str | None:
    status = query_arg("status")
    if status is not None and status not in search.STATUSES:
        raise ValidationError("invalid_query", "status", "must be one of " + ", ".join(search.STATUSES))
    return status


@bp.get("/leads")
def search_leads() -> ResponseReturnValue:
    """The ledger's leads, newest first (received_at, then the row), filtered by publisher_id,
    buyer_id, status (the ledger's: sold, unsold, returned, test_sold, test_unsold), since
    (inclusive) and until (exclusive); each as GET /v1/admin/leads/<id> shows it."""
    page = lead_page()
    return jsonify({"items": page.items, "next_cursor": page.next_cursor})


def lead_page() -> search.Page:
    """The page of the lead search the query string asks for (400 invalid_query for a filter,
    limit or cursor it cannot take)."""
    query = LeadQuery(
        publisher_id=_id_arg("publisher_id"),
        buyer_id=_id_arg("buyer_id"),
        status=_status(),
        since=_instant("since"),
        until=_instant("until"),
    )
    limit = _limit()
    try:
        return search.search(query, limit=limit, cursor=_cursor())
    except BadCursor:
        raise _bad_cursor() from None
