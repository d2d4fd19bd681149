"""A publisher's monthly statement (docs/api.md "Sales", docs/leads.md "Payout holds"), read from
its sales: the month's sales, each a line of its payout as it stands now (`held`, `payable`, or
`returned`: returned while held, so never payable), and the month's adjustments, one line per
return made in the month of a sale whose payout was payable (a negative amount).

    earned = returned + held + payable     (the month's sales)
    adjustments                            (the month's returns after payable, ≤ 0)

and, over every month, the publisher's `balance` = Σ payable + Σ adjustments and its
`payout_held` = Σ held (payouts.py moves both with the sales' states). The figures are added
up from the very lines the answer carries, and the answer is streamed a page at a time, as the
buyer's statement (billing/statement.py, whose month, paging and CSV it uses)."""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any, cast

import peewee as pw

from webhooks.billing import statement
from webhooks.billing.statement import Month
from webhooks.errors import NotFound
from webhooks.storage.records.models import Publisher, Sale
from webhooks.storage.states import PayoutState, SaleStatus

CSV_COLUMNS = ("at", "kind", "lead_id", "buyer_id", "amount", "payable_at")
ADJUSTMENT = "adjustment"
_KIND = {PayoutState.HELD: "held", PayoutState.PAYABLE: "payable", PayoutState.CANCELLED: "returned"}
FIGURES = ("earned", "returned", "held", "payable", "adjustments")


def month(text: str | None, today: date) -> Month:
    """`?month=YYYY-MM` (UTC), this month when absent; 400 invalid_query when malformed."""
    return statement.month(text or today.strftime("%Y-%m"), today)


def publisher_id_of(publisher_id: str) -> str:
    """404 not_found for no such publisher."""
    if not Publisher.select().where(Publisher.id == publisher_id).exists():
        raise NotFound(f"no publisher {publisher_id!r}")
    return publisher_id


@dataclass(frozen=True, kw_only=True)
class Line:
    at: datetime  # the sale's sold_at; an adjustment's returned_at
    kind: str  # held, payable, returned (cancelled while held), adjustment
    lead_id: str
    buyer_id: str
    amount: Decimal  # the payout; an adjustment's is negative
    payable_at: datetime | None
    order: int  # the sale's id: a stable order among lines of one instant


def _line(row: tuple[Any, ...], kind: str | None) -> Line:
    """A line of a row of _COLUMNS (its `at` a sale's sold_at or returned_at): a sale's kind
    from its payout state, or `kind` (an adjustment: the payout taken back)."""
    pk, at, lead_id, buyer_id, payout, payable_at, state = row
    amount = Decimal(payout or 0)
    return Line(
        at=statement.utc(at),
        kind=kind or _KIND[PayoutState(state)],
        lead_id=lead_id,
        buyer_id=buyer_id,
        amount=Decimal(0) - amount if kind == ADJUSTMENT else amount,  # never "-0.00"
        payable_at=payable_at,
        order=int(pk),
    )


def _columns(at: Any) -> tuple[Any, ...]:
    """What a line is made of (_line), `at` second as statement.pages reads it."""
    return (Sale.id, at, Sale.lead_id, Sale.buyer_id, Sale.payout, Sale.payable_at, Sale.payout_state)


def _sales(publisher_id: str, period: Month) -> Iterator[Line]:
    query = Sale.select(*_columns(Sale.sold_at)).where(Sale.publisher_id == publisher_id)
    for rows in statement.pages(query, Sale.sold_at, Sale.id, period):
        yield from (_line(row, None) for row in rows)


def _adjusted(publisher_id: str) -> Any:
    """The publisher's sales returned after their payout was payable: its adjustments."""
    return (
        (Sale.publisher_id == publisher_id)
        & (Sale.status == SaleStatus.RETURNED)
        & (Sale.payout_state == PayoutState.PAYABLE)
    )


def _adjustments(publisher_id: str, period: Month) -> Iterator[Line]:
    query = Sale.select(*_columns(Sale.returned_at)).where(_adjusted(publisher_id))
    for rows in statement.pages(query, Sale.returned_at, Sale.id, period):
        yield from (_line(row, ADJUSTMENT) for row in rows)


def lines(publisher_id: str, period: Month) -> Iterator[Line]:
    """The month's lines in time order: its sales and its adjustments, each read a page at a
    time and merged as they come."""
    return heapq.merge(
        _sales(publisher_id, period), _adjustments(publisher_id, period), key=lambda line: (line.at, line.order)
    )


@dataclass
class Totals:
    amounts: dict[str, Decimal] = field(default_factory=lambda: {name: Decimal(0) for name in FIGURES})

    def add(self, kind: str, amount: Decimal) -> None:
        if kind == ADJUSTMENT:
            self.amounts["adjustments"] += amount
            return
        self.amounts["earned"] += amount
        self.amounts[kind] += amount

    def shown(self) -> dict[str, str]:
        return {name: f"{self.amounts[name]:.2f}" for name in FIGURES}


def line_json(line: Line) -> dict[str, Any]:
    return {
        "at": statement.iso(line.at),
        "kind": line.kind,
        "lead_id": line.lead_id,
        "buyer_id": line.buyer_id,
        "amount": f"{line.amount:.2f}",
        "payable_at": None if line.payable_at is None else statement.iso(line.payable_at),
    }


def as_json(publisher_id: str, period: Month) -> Iterator[str]:
    """The statement as JSON text, piece by piece: the figures come after the lines they are
    added up from."""
    totals = Totals()
    yield json.dumps({"publisher_id": publisher_id, "month": period.label})[:-1] + ', "lines": ['
    first = True
    for line in lines(publisher_id, period):
        totals.add(line.kind, line.amount)
        yield ("" if first else ", ") + json.dumps(line_json(line))
        first = False
    yield "], " + json.dumps(totals.shown())[1:] + "\n"


def as_csv(publisher_id: str, period: Month) -> Iterator[str]:
    """The month's lines as CSV (csvsafe: amounts as numbers, ids escaped against formulas)."""
    yield statement.csv_rows([CSV_COLUMNS])
    batch: list[list[Any]] = []
    for line in lines(publisher_id, period):
        shown = line_json(line)
        batch.append([shown[c] for c in CSV_COLUMNS])
        batch[-1][CSV_COLUMNS.index("amount")] = line.amount  # a number, not text
        if len(batch) >= statement.PAGE:
            yield statement.csv_rows(batch)
            batch = []
    if batch:
        yield statement.csv_rows(batch)


def summary(publisher_id: str, period: Month, last: int) -> dict[str, Any]:
    """The month's figures, added up by the database (two indexed range reads grouped), and its
    `last` lines, newest first: what the console's publisher page shows. The same figures as
    the full statement's, which adds up its own lines."""
    totals = Totals()
    in_month = (Sale.sold_at >= period.start) & (Sale.sold_at < period.end)
    sums = (
        Sale.select(Sale.payout_state, pw.fn.SUM(Sale.payout))
        .where(Sale.publisher_id == publisher_id, in_month)
        .group_by(Sale.payout_state)
        .tuples()
    )
    for state, amount in cast("Iterable[tuple[str, Decimal | None]]", sums):
        totals.add(_KIND[PayoutState(state)], Decimal(amount or 0))
    adjusted = (
        Sale.select(pw.fn.SUM(Sale.payout))
        .where(_adjusted(publisher_id), Sale.returned_at >= period.start, Sale.returned_at < period.end)
        .scalar()
    )
    totals.add(ADJUSTMENT, Decimal(0) - Decimal(adjusted or 0))
    newest = sorted(_newest(publisher_id, period, last), key=lambda line: (line.at, line.order), reverse=True)[:last]
    return {
        "month": period.label,
        **totals.shown(),
        "lines": [line_json(line) for line in newest],
        "more": len(newest) == last,
    }


def _newest(publisher_id: str, period: Month, last: int) -> Iterator[Line]:
    """Up to `last` newest sales and `last` newest adjustments of the month."""
    for at, kind, mine in (
        (Sale.sold_at, None, Sale.publisher_id == publisher_id),
        (Sale.returned_at, ADJUSTMENT, _adjusted(publisher_id)),
    ):
        query = (
            Sale.select(*_columns(at))
            .where(mine, at >= period.start, at < period.end)
            .order_by(at.desc(), Sale.id.desc())
            .limit(last)
            .tuples()
        )
        yield from (_line(row, kind) for row in cast("Iterable[tuple[Any, ...]]", query))
