"""The lead search of GET /v1/admin/leads: the ledger's leads by publisher, buyer, status and
time received, or looked up by id, e-mail or phone, newest first, a page at a time under an
opaque keyset cursor; and any search as CSV.

Each filter has an index that ends in (received_at, id) (sql/017), so a page reads `limit`
rows of one index from the cursor on, however deep the page is: the cursor is the last
lead's sort key, never an offset. A lookup reads the ids it names from the indexes of the
lead id and of the consumer keys' digests (sql/030) first: a few rows, whatever the depth."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import peewee as pw

from webhooks.billing.statement import csv_rows
from webhooks.errors import InvalidJSON
from webhooks.formats import consumer, strictjson
from webhooks.formats.validate import is_id
from webhooks.leads.accounting.ledger import attempts_of, lead_view, sales_of
from webhooks.leads.accounting.lookup import digest
from webhooks.storage.records.models import Lead, Sale
from webhooks.storage.states import LeadStatus

MAX_LIMIT = 500
DEFAULT_LIMIT = 100
MAX_CURSOR = 512  # characters: a cursor this module writes is under 100
MAX_ROW_ID = (1 << 63) - 1  # the ledger's ids are BIGINT
STATUSES = tuple(str(s) for s in LeadStatus)  # the ledger's statuses: test leads as test_sold...
MAX_LOOKUP = consumer.MAX_VALUE  # characters of what the search box takes
MAX_MATCHES = 1_000  # leads one lookup value finds at most (a consumer, or a lead id many publishers used)
CSV_PAGE = 500  # leads read a page at a time while the CSV streams
CSV_COLUMNS = (
    "received_at",
    "publisher_id",
    "lead_id",
    "status",
    "test",
    "buyer_id",
    "price",
    "payout",
    "sales",
    "returned_at",
    "return_reason",
)


class BadCursor(ValueError):
    """A cursor this module did not write."""


@dataclass(frozen=True, kw_only=True)
class Lookup:
    """What the one search box holds, as the ledger finds it: a lead id, and the digests of the
    e-mail address or phone number it may be (each None when it cannot be one)."""

    lead_id: str | None
    email_digest: str | None
    phone_digest: str | None


def lookup(text: str, key: bytes) -> Lookup:
    """The Lookup of `text` (at most MAX_LOOKUP characters, the caller checks): an id as it is,
    an e-mail or phone by its consumer key (trimmed and lower-cased; E.164), the normaliser of
    dedupe and suppression, digested under `key` (SUPPRESSION_KEY) as the ledger keeps it."""
    bare = text.strip()
    found = {field: consumer.key(field, bare) for field in consumer.FIELDS}
    return Lookup(
        lead_id=bare if is_id(bare) else None,
        email_digest=None if found["email"] is None else digest(key, found["email"]),
        phone_digest=None if found["phone"] is None else digest(key, found["phone"]),
    )


@dataclass(frozen=True, kw_only=True)
class LeadQuery:
    """The filters of a search; times aware, `since` inclusive and `until` exclusive; `lookup`
    the leads of an id, e-mail or phone."""

    publisher_id: str | None = None
    buyer_id: str | None = None
    status: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    lookup: Lookup | None = None


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None


def encode_cursor(key: Sequence[Any]) -> str:
    """base64url (unpadded) of the JSON of a sort key."""
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> list[Any]:
    """The sort key an encode_cursor wrote; BadCursor for anything else, read by the strict
    parser (nesting, duplicate keys and huge numbers refused in linear time)."""
    if len(cursor) > MAX_CURSOR:
        raise BadCursor(cursor[:64])
    try:
        key = strictjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, InvalidJSON) as exc:
        raise BadCursor(cursor) from exc
    if not isinstance(key, list):
        raise BadCursor(cursor)
    return key


def time_key(cursor: str) -> tuple[datetime, int]:
    """The (instant, id) a cursor of a list in time order holds (a lead's received_at, a sale's
    sold_at): an instant Python holds (naive UTC, as the ledger stores it) and a row id the
    ledger's BIGINT can hold."""
    key = decode_cursor(cursor)
    if len(key) != 2 or not isinstance(key[0], str) or type(key[1]) is not int or not 0 < key[1] <= MAX_ROW_ID:
        raise BadCursor(cursor)
    try:
        received = datetime.fromisoformat(key[0])
    except ValueError as exc:
        raise BadCursor(cursor) from exc
    if received.tzinfo is not None:
        raise BadCursor(cursor)
    return received, key[1]


def _naive(at: datetime) -> datetime:
    """An aware instant as the ledger stores it: naive UTC."""
    return at.astimezone(timezone.utc).replace(tzinfo=None)


def _matching_ids(found: Lookup) -> list[int]:
    """The row ids of the leads a lookup names, each value read on its own index (the newest
    MAX_MATCHES of each)."""
    ids: set[int] = set()
    for field, value in (
        (Lead.lead_id, found.lead_id),
        (Lead.email_digest, found.email_digest),
        (Lead.phone_digest, found.phone_digest),
    ):
        if value is not None:
            ids.update(
                row.id for row in Lead.select(Lead.id).where(field == value).order_by(Lead.id.desc()).limit(MAX_MATCHES)
            )
    return sorted(ids)


def _where(query: LeadQuery, after: tuple[datetime, int] | None) -> list[pw.Expression]:
    """The conditions of the query on its leads; the buyer's: its first buyer (a test lead's
    would-be one), the leads of its other sales being read apart (_sold_keys)."""
    conds: list[pw.Expression] = []
    if query.lookup is not None:  # a few ids: the primary key answers, sorted in memory
        conds.append(Lead.id.in_(_matching_ids(query.lookup)))
    if query.publisher_id is not None:
        conds.append(Lead.publisher_id == query.publisher_id)
    if query.buyer_id is not None:
        conds.append(Lead.buyer_id == query.buyer_id)
    if query.status is not None:
        conds.append(Lead.status == query.status)
    if query.since is not None:
        conds.append(Lead.received_at >= _naive(query.since))
    if query.until is not None:
        conds.append(Lead.received_at < _naive(query.until))
    if after is not None:
        # (received_at, id) < after, written so that both engines read it as a range of the index
        at, row_id = after
        conds.append(Lead.received_at <= at)
        conds.append((Lead.received_at < at) | (Lead.id < row_id))
    return conds


def page_query(query: LeadQuery, *, limit: int, cursor: str | None) -> pw.ModelSelect[Lead]:
    """The sort keys of a page's leads and of the one after it (whether there is a next page), in
    order, as a query that one index answers alone (sql/017); BadCursor for a cursor not ours.

    Only ids: asked for whole rows with a cursor, MariaDB walks the filter's index by its first
    column alone (`ref`) and reads every row on the way, half the month for a mid-month page;
    asked for what the index holds, it reads the range from the cursor on."""
    after = time_key(cursor) if cursor is not None else None
    conds = _where(query, after)
    select = Lead.select(Lead.id, Lead.received_at)
    if conds:
        select = select.where(*conds)
    return select.order_by(Lead.received_at.desc(), Lead.id.desc()).limit(limit + 1)


SALE_SKEW = timedelta(hours=1)  # a sale's time is never before its lead's; the processes' clocks may differ


def _sold_keys(query: LeadQuery, after: tuple[datetime, int] | None, floor: datetime | None, limit: int) -> list[Lead]:
    """The sort keys of the leads of the query sold to its buyer (a sale of any of the lead's
    buyers), received at `floor` or after (None: any time), newest first, as page_query's.
    A sale is made after its lead is received: the buyer's sales from `floor` on, a range of
    its (buyer_id, sold_at) index, hold them all, where all its sales held them before (a
    temporary table of each of them, every page: seconds for a buyer of 250,000 sales)."""
    sold = Sale.select(Sale.publisher_id, Sale.lead_id).where(Sale.buyer_id == query.buyer_id)
    conds = [*_where(replace(query, buyer_id=None), after)]
    if floor is not None:
        sold = sold.where(Sale.sold_at >= floor - SALE_SKEW)
        conds.append(Lead.received_at >= floor)
    conds.append(pw.Tuple(Lead.publisher_id, Lead.lead_id).in_(sold))
    select = Lead.select(Lead.id, Lead.received_at).where(*conds)
    return list(select.order_by(Lead.received_at.desc(), Lead.id.desc()).limit(limit + 1))


def page_keys(query: LeadQuery, *, limit: int, cursor: str | None) -> list[Lead]:
    """The sort keys of a page's leads and of the one after it, newest first. With a buyer:
    the leads it bought first (page_query), and those it bought beside another, read from the
    first page's oldest key on (_sold_keys), merged."""
    first = list(page_query(query, limit=limit, cursor=cursor))
    if query.buyer_id is None:
        return first
    floor = first[limit].received_at if len(first) > limit else None
    after = time_key(cursor) if cursor is not None else None
    merged = {key.id: key for key in [*first, *_sold_keys(query, after, floor, limit)]}
    return sorted(merged.values(), key=lambda key: (key.received_at, key.id), reverse=True)[: limit + 1]


def search(query: LeadQuery, *, limit: int = DEFAULT_LIMIT, cursor: str | None = None) -> Page:
    """One page of leads, newest first (received_at, then id), each as lead_view shows it;
    BadCursor for a cursor not ours."""
    keys = page_keys(query, limit=limit, cursor=cursor)
    ids = [key.id for key in keys[:limit]]
    rows = {lead.id: lead for lead in Lead.select().where(Lead.id.in_(ids))} if ids else {}
    leads = [rows[i] for i in ids if i in rows]  # a lead gone meanwhile is left out
    attempts, sales = attempts_of(leads), sales_of(leads)
    items = [
        lead_view(lead, attempts[(lead.publisher_id, lead.lead_id)], sales[(lead.publisher_id, lead.lead_id)])
        for lead in leads
    ]
    last = keys[limit - 1] if len(keys) > limit else None
    next_cursor = None if last is None else encode_cursor([last.received_at.isoformat(), last.id])
    return Page(items, next_cursor)


def as_csv(query: LeadQuery) -> Iterator[str]:
    """Every lead of a search as CSV, newest first, read CSV_PAGE leads at a time (memory
    bounded by a page, however many match); text cells escaped against formulas (csvsafe),
    figures as numbers."""
    yield csv_rows([CSV_COLUMNS])
    cursor = None
    while True:
        found = search(query, limit=CSV_PAGE, cursor=cursor)
        yield csv_rows(_csv_line(item) for item in found.items)
        if found.next_cursor is None:
            return
        cursor = found.next_cursor


def _csv_line(item: dict[str, Any]) -> list[Any]:
    sales = ";".join(f"{s['buyer_id']}:{s['price']}:{s['status']}" for s in item["sales"])
    return [
        item["received_at"],
        item["publisher_id"],
        item["lead_id"],
        item["status"],
        "yes" if item["test"] else "",
        item["buyer_id"],
        _amount(item["price"]),
        _amount(item["commission"]),
        sales,
        item["returned_at"],
        item["return_reason"],
    ]


def _amount(value: str | None) -> Decimal | None:
    return None if value is None else Decimal(value)
