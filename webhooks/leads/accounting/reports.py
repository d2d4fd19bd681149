"""The leads report (docs/api.md "Reports"): leads, sold, unsold, returned, revenue, payout,
profit, return rate, offers, accept rate, conversions and earnings per offer per publisher,
buyer, day or hour, read from `lead_stats` (per hour, publisher and buyer, counted in the
transaction of each settlement, return and first conversion; test leads never).
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
from webhooks.storage.records.db import is_mysql
from webhooks.storage.records.models import Lead, LeadStats
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
    for key, d in sorted(deltas.items()):
        _add(key, d)


def count_returned(lead: Lead, *, price: Decimal, payout: Decimal | None, buyer_id: str) -> None:
    """A sale of `lead` returned: counted as returned, its price and payout out of the sums (in
    the hour the lead was received, as its sale was counted)."""
    delta = _Delta(returned=1, revenue=-Decimal(price), payout=-Decimal(payout or 0))
    _add((_hour(lead.received_at), lead.publisher_id, buyer_id), delta)


def count_conversion(received_at: datetime, *, publisher_id: str, buyer_id: str) -> None:
    """A sale's first `converted` feedback, in the caller's transaction: counted in its buyer's
    row of the hour its lead was received (`received_at`, naive UTC), where the sale is."""
    _add((_hour(received_at), publisher_id, buyer_id), _Delta(conversions=1))


def _add(key: tuple[datetime, str, str], d: _Delta) -> None:
    hour, publisher_id, buyer_id = key
    update = {
        LeadStats.leads: LeadStats.leads + d.leads,
        LeadStats.sold: LeadStats.sold + d.sold,
        LeadStats.returned: LeadStats.returned + d.returned,
        LeadStats.revenue: LeadStats.revenue + d.revenue,
        LeadStats.payout: LeadStats.payout + d.payout,
        LeadStats.sales: pw.fn.COALESCE(LeadStats.sales, 0) + d.sales,
        LeadStats.offers: LeadStats.offers + d.offers,
        LeadStats.accepted: LeadStats.accepted + d.accepted,
        LeadStats.conversions: LeadStats.conversions + d.conversions,
    }
    query = LeadStats.insert(
        hour=hour,
        publisher_id=publisher_id,
        buyer_id=buyer_id,
        leads=d.leads,
        sold=d.sold,
        returned=d.returned,
        revenue=d.revenue,
        payout=d.payout,
        sales=d.sales,
        offers=d.offers,
        accepted=d.accepted,
        conversions=d.conversions,
    )
    if is_mysql():
        query = query.on_conflict(update=update)  # ON DUPLICATE KEY UPDATE
    else:
        query = query.on_conflict(
            conflict_target=[LeadStats.hour, LeadStats.publisher_id, LeadStats.buyer_id], update=update
        )
    query.execute()


def _key_expression(group_by: str) -> Any:
    if group_by == "publisher":
        return LeadStats.publisher_id
    if group_by == "buyer":
        return LeadStats.buyer_id
    pattern = "%Y-%m-%d" if group_by == "day" else "%Y-%m-%dT%H:00:00Z"
    # coerce(False): the text as formatted, not read back through the hour column's converter
    if is_mysql():
        return pw.fn.DATE_FORMAT(LeadStats.hour, pattern).coerce(False)
    return pw.fn.strftime(pattern, LeadStats.hour).coerce(False)


def report_query(first: date, last: date, group_by: str, buyer_id: str | None = None) -> Any:
    """The aggregate over the hours from `first` to `last` (inclusive, UTC days), by the key of
    `group_by`: one range scan of lead_stats' (hour, publisher, buyer) index; of one buyer's
    rows only when `buyer_id` is given (a buyer's page)."""
    key = _key_expression(group_by).alias("key")
    start = datetime(first.year, first.month, first.day)
    end = datetime(last.year, last.month, last.day) + timedelta(days=1)
    where = [LeadStats.hour >= start, LeadStats.hour < end]
    if buyer_id is not None:
        where.append(LeadStats.buyer_id == buyer_id)
    return (
        LeadStats.select(key, *(pw.fn.SUM(getattr(LeadStats, name)).alias(name) for name in SUMMED))
        .where(*where)
        .group_by(pw.SQL("1"))
        .order_by(pw.SQL("1"))
        .tuples()
    )


def report(first: date, last: date, group_by: str, *, buyer_id: str | None = None) -> dict[str, Any]:
    """The report of the leads received from `first` to `last` (inclusive, UTC days); of one
    buyer's rows only with `buyer_id` (its figures are then its row of the report by buyer)."""
    found = cast(
        "list[tuple[Any, ...]]", list(report_query(first, last, group_by, buyer_id))
    )  # peewee's stubs: .tuples() yields models
    figures = [(k or None, _figures(raw)) for k, *raw in found]
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
