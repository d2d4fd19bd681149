"""The query string of a list, read alike by the admin API, the console and the buyer API:
`?limit=` 1-500 (default 100), `?cursor=` the last page's `next_cursor`, and the filters of
the lead search (`?q=` an id, e-mail or phone; `since` and `until` an instant or a UTC day)
and of a buyer's sales."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone
from typing import TypeVar

import peewee as pw

from webhooks import services
from webhooks.errors import ValidationError
from webhooks.formats.validate import DAY, day, instant, is_id
from webhooks.leads.accounting import buyer_sales, search
from webhooks.leads.accounting.search import BadCursor, LeadQuery, decode_cursor, encode_cursor
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


def _day_or_instant(name: str, *, end: bool) -> datetime | None:
    """`?since=` or `?until=` of the lead search: an instant with an offset, or a UTC day as a
    date picker sends it (YYYY-MM-DD: from its start, or `end`, until the next day's)."""
    raw = query_arg(name)
    if raw is None:
        return None
    if not DAY.fullmatch(raw):
        problem = "must be a UTC day (YYYY-MM-DD) or an ISO 8601 instant with an offset"
        return instant("invalid_query", name, raw, problem=problem, offset_required=True)
    start = datetime.combine(day("invalid_query", name, raw), time(), timezone.utc)
    if not end:
        return start
    return None if start.date() == date.max else start + timedelta(days=1)  # until the last day: no bound


def _lookup() -> search.Lookup | None:
    """`?q=`: a lead id, an e-mail address or a phone number (400 for what can be none)."""
    raw = query_arg("q")
    if raw is None or not raw.strip():
        return None
    if len(raw) > search.MAX_LOOKUP:
        raise ValidationError("invalid_query", "q", f"must be at most {search.MAX_LOOKUP} characters")
    found = search.lookup(raw, services.current().config.suppression_key.encode())
    if found.lead_id is None and found.email_digest is None and found.phone_digest is None:
        raise ValidationError("invalid_query", "q", "must be a lead id, an e-mail address or a phone number")
    return found


def lead_query() -> LeadQuery:
    """The lead search the query string asks for (400 invalid_query for a filter it cannot take)."""
    return LeadQuery(
        publisher_id=_id_arg("publisher_id"),
        buyer_id=_id_arg("buyer_id"),
        status=_status(),
        since=_day_or_instant("since", end=False),
        until=_day_or_instant("until", end=True),
        lookup=_lookup(),
    )


def lead_page() -> search.Page:
    """The page of the lead search the query string asks for (400 invalid_query for a filter,
    limit or cursor it cannot take)."""
    query = lead_query()
    limit = _limit()
    try:
        return search.search(query, limit=limit, cursor=_cursor())
    except BadCursor:
        raise _bad_cursor() from None


def sale_page(buyer_id: str) -> search.Page:
    """The page of the buyer's own sales the query string asks for: `?status=` (sold,
    return_pending, returned), `?since=` (on sold_at, inclusive); 400 invalid_query as above."""
    status = query_arg("status")
    if status is not None and status not in buyer_sales.STATUSES:
        raise ValidationError("invalid_query", "status", "must be one of " + ", ".join(buyer_sales.STATUSES))
    query = buyer_sales.SaleQuery(buyer_id=buyer_id, status=status, since=_instant("since"))
    limit = _limit()
    try:
        return buyer_sales.page(query, limit=limit, cursor=_cursor())
    except BadCursor:
        raise _bad_cursor() from None
