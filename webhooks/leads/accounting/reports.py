"""The leads report (docs/api.md "Reports"): leads, sold, unsold, returned, revenue, payout,
profit, return rate, offers, accept rate, conversions and earnings per offer per publisher,
buyer, day or hour, read from `lead_stats` (per hour, publisher and buyer, counted in the
transaction of each settlement, return and first conversion; test leads never) and its days,
`lead_stats_days` (kept beside it in the same transactions: a report by day, publisher or buyer
reads a row per day, not 24).
docs/operations.md "The leads report"."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, cast

import peewee as pw

from webhooks.formats import csvsafe
from webhooks.leads.accounting.item import SettlementItem
from webhooks.storage.records.db import db, is_mysql, retried
from webhooks.storage.records.models import Lead, LeadStats, LeadStatsDay
from webhooks.storage.states import AttemptOutcome, LeadStatus

GROUPS = ("publisher", "buyer", "day", "hour")
MAX_DAYS = 366
COLUMNS = (
    "key",
    "leads",
    "sold",
    "unsold",
    "sales",
    "returned",
    "revenue",
    "payout",
    "profit",
    "return_rate",
    "offers",
    "accept_rate",
    "conversions",
    "epl",
)
ZERO = Decimal("0.00")
MONEY = ("revenue", "payout", "profit", "epl")
# lead_stats' columns a report adds up, in the order _row takes them
SUMMED = ("leads", "sold", "returned", "revenue", "payout", "sales", "offers", "accepted", "conversions")
# Attempt outcomes that never reached the buyer: no offer was made.
NOT_OFFERED = frozenset({AttemptOutcome.CIRCUIT_OPEN, AttemptOutcome.NOT_SENT})


def _hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0, tzinfo=None)


@dataclass
class _Delta:
    leads: int = 0
    sold: int = 0
    returned: int = 0
    revenue: Decimal = ZERO
    payout: Decimal = ZERO
    sales: int = 0
    offers: int = 0
    accepted: int = 0
    conversions: int = 0


def count_settled(items: Iterable[SettlementItem]) -> None:
    """Add newly settled leads (settlement items) to their hours, in the caller's transaction:
    a lead in its first buyer's row (`leads`, `sold`), each of its sales in its buyer's
    (`sales`, `revenue`, `payout`: a shared lead's several), each of its attempts in its
    buyer's (`offers`, and `accepted` for a yes)."""
    deltas: dict[tuple[datetime, str, str], _Delta] = {}
    for item in items:
        if item.status not in (LeadStatus.SOLD, LeadStatus.UNSOLD):
            continue  # a test lead
        at = datetime.fromisoformat(item.received_at)  # aware UTC, as the web process wrote it
        if at.tzinfo is not None:
            at = at.astimezone(timezone.utc)
        d = deltas.setdefault((_hour(at), item.publisher_id, item.buyer_id or ""), _Delta())
        d.leads += 1
        if item.status == LeadStatus.SOLD:
            d.sold += 1
        for sale in item.sales():
            d = deltas.setdefault((_hour(at), item.publisher_id, sale.buyer_id), _Delta())
            d.sales += 1
            d.revenue += Decimal(sale.price or 0)
            d.payout += Decimal(sale.payout or 0)
        for attempt in item.attempts:
            if attempt["outcome"] in NOT_OFFERED:
                continue
            d = deltas.setdefault((_hour(at), item.publisher_id, attempt["buyer_id"]), _Delta())
            d.offers += 1
            d.accepted += int(attempt["outcome"] == AttemptOutcome.ACCEPTED)
    _add(deltas)


def count_returned(lead: Lead, *, price: Decimal, payout: Decimal | None, buyer_id: str) -> None:
    """A sale of `lead` returned: counted as returned, its price and payout out of the sums (in
    the hour the lead was received, as its sale was counted)."""
    delta = _Delta(returned=1, revenue=-Decimal(price), payout=-Decimal(payout or 0))
    _add({(_hour(lead.received_at), lead.publisher_id, buyer_id): delta})


def count_conversion(received_at: datetime, *, publisher_id: str, buyer_id: str) -> None:
    """A sale's first `converted` feedback, in the caller's transaction: counted in its buyer's
    row of the hour its lead was received (`received_at`, naive UTC), where the sale is."""
    _add({(_hour(received_at), publisher_id, buyer_id): _Delta(conversions=1)})


def _add(deltas: dict[tuple[datetime, str, str], _Delta]) -> None:
    """Add the deltas to their hours' rows of lead_stats and their days' of lead_stats_days:
    one upsert statement of every row for each table, in the caller's transaction, the rows in
    key order (two batches lock them in the same order)."""
    days: dict[tuple[date, str, str], _Delta] = {}
    for (hour, publisher_id, buyer_id), d in deltas.items():
        day = days.setdefault((hour.date(), publisher_id, buyer_id), _Delta())
        for name in SUMMED:
            setattr(day, name, getattr(day, name) + getattr(d, name))
    _upsert(LeadStats, LeadStats.hour, sorted(deltas.items()))
    _upsert(LeadStatsDay, LeadStatsDay.day, sorted(days.items()))


def _upsert(model: Any, when: Any, rows: Sequence[tuple[tuple[date, str, str], _Delta]]) -> None:
    """Add each delta to `model`'s row of its (`when`, publisher, buyer), made at zero if new."""
    if not rows:
        return

    def incoming(name: str) -> Any:  # the value the statement brought for a row already there
        return pw.SQL(f"VALUES({name})" if is_mysql() else f"excluded.{name}")

    update = {getattr(model, name): getattr(model, name) + incoming(name) for name in SUMMED}
    update[model.sales] = pw.fn.COALESCE(model.sales, 0) + incoming("sales")  # NULL in old hours (sql/025)
    values = [
        {when: at, model.publisher_id: publisher_id, model.buyer_id: buyer_id}
        | {getattr(model, name): getattr(d, name) for name in SUMMED}
        for (at, publisher_id, buyer_id), d in rows
    ]
    query = model.insert_many(values)
    if is_mysql():
        query = query.on_conflict(update=update)  # ON DUPLICATE KEY UPDATE
    else:
        query = query.on_conflict(conflict_target=[when, model.publisher_id, model.buyer_id], update=update)
    query.execute()


def rebuild_day(day: date) -> int:
    """Make `day`'s rows of lead_stats_days again from its hours in lead_stats, in one
    transaction (retried whole on a deadlock): for a day whose hours were counted by a process
    that kept no days (one still running the release before sql/034 while it was applied). The
    hours are read FOR UPDATE on MySQL, so a settlement of that day waits, then counts in both.
    The day's rows made; safe to run again and beside settlement."""
    start = datetime(day.year, day.month, day.day)

    def transaction() -> int:
        with db.atomic():
            hours = LeadStats.select(
                LeadStats.publisher_id, LeadStats.buyer_id, *(getattr(LeadStats, n) for n in SUMMED)
            ).where(LeadStats.hour >= start, LeadStats.hour < start + timedelta(days=1))
            if is_mysql():
                hours = hours.for_update()
            sums: dict[tuple[str, str], list[Any]] = {}
            for row in hours.order_by(LeadStats.hour, LeadStats.publisher_id, LeadStats.buyer_id):
                got = sums.setdefault((row.publisher_id, row.buyer_id), [0] * len(SUMMED))
                for i, name in enumerate(SUMMED):
                    got[i] += getattr(row, name) or 0
            LeadStatsDay.delete().where(LeadStatsDay.day == day).execute()
            rows = [
                {"day": day, "publisher_id": p, "buyer_id": b, **dict(zip(SUMMED, figures, strict=True))}
                for (p, b), figures in sorted(sums.items())
            ]
            for chunk in range(0, len(rows), 500):
                LeadStatsDay.insert_many(rows[chunk : chunk + 500]).execute()
            return len(rows)

    return retried(transaction, f"the report's day {day.isoformat()} made again")


def report_query(first: date, last: date, group_by: str, buyer_id: str | None = None) -> Any:
    """The aggregate over the days from `first` to `last` (inclusive, UTC days), by the key of
    `group_by` as stored (a day's date, an hour's datetime, an id): by hour, one range scan of
    lead_stats' (hour, publisher, buyer) key grouped in its order; else of lead_stats_days'
    (day, publisher, buyer); of one buyer's rows only when `buyer_id` is given (a buyer's page:
    their (buyer_id, hour|day) index)."""
    model: Any = LeadStats if group_by == "hour" else LeadStatsDay
    when: Any
    if model is LeadStats:
        start = datetime(first.year, first.month, first.day)
        end = datetime(last.year, last.month, last.day) + timedelta(days=1)
        where = [LeadStats.hour >= start, LeadStats.hour < end]
        when = LeadStats.hour
    else:
        where = [LeadStatsDay.day >= first, LeadStatsDay.day <= last]
        when = LeadStatsDay.day
    if buyer_id is not None:
        where.append(model.buyer_id == buyer_id)
    key = {"publisher": model.publisher_id, "buyer": model.buyer_id}.get(group_by, when)
    return (
        model.select(key.alias("key"), *(pw.fn.SUM(getattr(model, name)).alias(name) for name in SUMMED))
        .where(*where)
        .group_by(key)
        .order_by(key)
        .tuples()
    )


def _key_text(key: Any) -> str | None:
    """A report row's key as the report gives it: an hour as `2026-12-01T13:00:00Z`, a day as
    `2026-12-01`, an id as itself; None for '' (the unsold leads' buyer)."""
    if isinstance(key, datetime):
        return key.strftime("%Y-%m-%dT%H:00:00Z")
    if isinstance(key, date):
        return key.isoformat()
    return key or None


def report(first: date, last: date, group_by: str, *, buyer_id: str | None = None) -> dict[str, Any]:
    """The report of the leads received from `first` to `last` (inclusive, UTC days); of one
    buyer's rows only with `buyer_id` (its figures are then its row of the report by buyer)."""
    found = cast(
        "list[tuple[Any, ...]]", list(report_query(first, last, group_by, buyer_id))
    )  # peewee's stubs: .tuples() yields models
    figures = [(_key_text(k), _figures(raw)) for k, *raw in found]
    rows = [_row(k, f) for k, f in figures]
    zeros = _figures([None] * len(SUMMED))
    totals = _row(None, [sum((f[i] for _k, f in figures), start=z) for i, z in enumerate(zeros)])
    totals.pop("key")
    return {"from": first.isoformat(), "to": last.isoformat(), "group_by": group_by, "rows": rows, "totals": totals}


def _figures(raw: Sequence[Any]) -> list[Any]:
    """A row's sums as read (SUM() answers decimals, or NULL), in SUMMED's order: money as
    Decimal with two places, counts as int."""
    return [Decimal(v or 0).quantize(ZERO) if n in MONEY else int(v or 0) for n, v in zip(SUMMED, raw, strict=True)]


def last_hours(now: datetime, hours: int = 24, *, buyer_id: str | None = None) -> list[dict[str, Any]]:
    """The `hours` hours up to `now`'s (UTC), oldest first, each with its leads, sold, sales,
    offers and revenue (zeros for an hour without leads): the chart on /ops; of one buyer's
    rows with `buyer_id` (the chart on its page: its offers and sales)."""
    end = _hour(now.astimezone(timezone.utc)) + timedelta(hours=1)
    start = end - timedelta(hours=hours)
    where = [LeadStats.hour >= start, LeadStats.hour < end]
    if buyer_id is not None:
        where.append(LeadStats.buyer_id == buyer_id)
    summed = (LeadStats.leads, LeadStats.sold, LeadStats.sales, LeadStats.offers, LeadStats.revenue)
    query = (
        LeadStats.select(LeadStats.hour, *(pw.fn.SUM(column) for column in summed))
        .where(*where)
        .group_by(LeadStats.hour)
        .tuples()
    )
    rows = cast("list[tuple[Any, ...]]", list(query))  # peewee's stubs: models
    found = {_hour(h): ([int(v or 0) for v in counts], Decimal(r or 0)) for h, *counts, r in rows}
    out = []
    for i in range(hours):
        hour = start + timedelta(hours=i)
        (leads, sold, sales, offers), revenue = found.get(hour, ([0, 0, 0, 0], ZERO))
        out.append(
            {
                "hour": hour,
                "leads": leads,
                "sold": sold,
                "sales": sales,
                "offers": offers,
                "revenue": revenue.quantize(ZERO),
            }
        )
    return out


def _rate(part: int, whole: int) -> Decimal:
    return (Decimal(part) / whole).quantize(Decimal("0.001")).normalize() if whole else Decimal(0)


def _row(key: Any, figures: Sequence[Any]) -> dict[str, Any]:
    """A report row from its figures, in SUMMED's order. `return_rate` is of the sales (an
    exclusive lead's one sale: of the sold leads); `accept_rate` of the offers; `epl`, the
    earnings per offer, the revenue (the sales not returned) over the offers."""
    leads, sold, returned, revenue, payout, sales, offers, accepted, conversions = figures
    return {
        "key": key,
        "leads": leads,
        "sold": sold,
        "unsold": leads - sold,
        "sales": sales,
        "returned": returned,
        "revenue": revenue,
        "payout": payout,
        "profit": revenue - payout,
        "return_rate": _rate(returned, sales),
        "offers": offers,
        "accept_rate": _rate(accepted, offers),
        "conversions": conversions,
        "epl": (revenue / offers).quantize(ZERO) if offers else ZERO,
    }


def as_json(result: dict[str, Any]) -> dict[str, Any]:
    """Money and rates as decimal strings (docs/api.md, Conventions)."""

    def text(name: str, value: Any) -> Any:
        if not isinstance(value, Decimal):
            return value
        return f"{value:.2f}" if name in MONEY else format(value, "f")

    def strings(row: dict[str, Any]) -> dict[str, Any]:
        return {k: text(k, v) for k, v in row.items()}

    return {**result, "rows": [strings(r) for r in result["rows"]], "totals": strings(result["totals"])}


def as_csv(result: dict[str, Any]) -> str:
    """The rows as CSV (csvsafe: text escaped against formulas, figures written as numbers)."""

    def typed(name: str, value: Any) -> Any:
        return value.quantize(ZERO) if isinstance(value, Decimal) and name in MONEY else value

    return csvsafe.write(COLUMNS, ([typed(c, row[c]) for c in COLUMNS] for row in result["rows"]))
