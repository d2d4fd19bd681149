"""A billed buyer's monthly statement (docs/api.md "Buyer balances", docs/buyers.md
"Statements"), read from the wallets' journal (`wallet_entries`, billing/wallets.py) of the
buyer's billing wallet.

`opening` is the sum of the wallet's rows before the month (UTC), read from its days added up
(wallet_days.py); the month's rows are then read in pages of PAGE by keyset on (at, id), each
page an indexed range read of (customer, currency, at), so that neither the database nor this process ever holds more
than a page however many leads a month holds, and the answer (JSON or CSV) is streamed page by
page. The month's figures are added up from the very lines the answer carries, so `closing` =
`opening` + `top_ups` − `spend` + `returns` − `reversals` = `opening` + the lines' amounts, always;
once the month is over it is also the sum of every row up to its end. A `carried` row (a
wallet's balance when the journal began) counts in `opening` before the month and is a `top_up`
line inside it."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any, cast

from webhooks.billing import wallet_days
from webhooks.billing.balance import Billing
from webhooks.billing.wallets import Entry
from webhooks.errors import Conflict, NotFound, ValidationError
from webhooks.formats import csvsafe, money
from webhooks.storage.records.models import Buyer, WalletEntry

PAGE = 5000  # lines per read: bounds memory and each query, whatever a month holds
FIRST_YEAR = 2000
CSV_COLUMNS = ("at", "kind", "amount", "reference")
_MONTH = re.compile(r"[0-9]{4}-[0-9]{2}")  # fullmatch: `$` would pass a trailing newline
# The kind a line shows: a carried balance inside the month is shown as the top-up it stands for.
_SHOWN = {Entry.CARRIED.value: Entry.TOP_UP.value}


@dataclass(frozen=True)
class Month:
    """A calendar month in UTC: [start, end) as the naive UTC datetimes the journal holds."""

    label: str  # YYYY-MM
    start: datetime
    end: datetime


@dataclass(frozen=True)
class BilledWallet:
    buyer_id: str
    account: str
    currency: str


def month(text: str | None, today: date) -> Month:
    """`?month=YYYY-MM`, from 2000-01 to December of next year; 400 invalid_query otherwise."""
    raw = text or ""
    year = int(raw[:4]) if _MONTH.fullmatch(raw) else 0
    number = int(raw[5:]) if year else 0
    if not (FIRST_YEAR <= year <= today.year + 1 and 1 <= number <= 12):
        raise ValidationError(
            "invalid_query", "month", f"must be a month YYYY-MM from {FIRST_YEAR}-01 to {today.year + 1}-12 (UTC)"
        )
    after = datetime(year + 1, 1, 1) if number == 12 else datetime(year, number + 1, 1)
    return Month(raw, datetime(year, number, 1), after)


def billed_wallet(buyer_id: str) -> BilledWallet:
    """The wallet the buyer is billed from: 404 not_found for no (or a deleted) buyer, 409
    not_billed for a buyer without `billing`."""
    row = Buyer.select(Buyer.id, Buyer.billing).where(Buyer.id == buyer_id, Buyer.deleted_at.is_null()).first()
    if row is None:
        raise NotFound(f"no buyer {buyer_id!r}")
    billing = Billing.from_json(row.billing)
    if billing is None:
        raise Conflict(f"buyer {buyer_id!r} is not billed from a wallet", code="not_billed")
    return BilledWallet(buyer_id, billing.account, billing.currency)


def opening(wallet: BilledWallet, start: datetime) -> int:
    """The sum of the wallet's rows before `start`: its balance when the month began (from its
    days added up, wallet_days.py)."""
    return sum(wallet_days.sums(wallet.account, wallet.currency, None, start).values())


@dataclass(frozen=True)
class Line:
    at: datetime
    kind: str  # as shown: top_up, sale, return, refund, dispute
    amount_minor: int
    reference: str


def lines(wallet: BilledWallet, period: Month) -> Iterator[list[Line]]:
    """The month's rows in (at, id) order, a page at a time."""
    mine = (WalletEntry.customer == wallet.account) & (WalletEntry.currency == wallet.currency)
    query = WalletEntry.select(
        WalletEntry.id, WalletEntry.at, WalletEntry.kind, WalletEntry.amount_minor, WalletEntry.reference
    ).where(mine)
    for rows in pages(query, WalletEntry.at, WalletEntry.id, period):
        yield [Line(utc(row[1]), _SHOWN.get(row[2], row[2]), int(row[3]), str(row[4])) for row in rows]


def pages(query: Any, at: Any, pk: Any, period: Month) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of `query` (selecting `pk` then `at` first) whose `at` falls in the month, in
    (at, pk) order, PAGE at a time by keyset: each page one indexed range read."""
    after: tuple[datetime, int] | None = None
    while True:
        if after is None:
            since = at >= period.start
        else:
            last_at, last_pk = after
            since = (at >= last_at) & ((at > last_at) | (pk > last_pk))
        page = query.where(since & (at < period.end)).order_by(at, pk).limit(PAGE).tuples()
        rows = list(cast("Iterable[tuple[Any, ...]]", page))
        if rows:
            yield rows
        if len(rows) < PAGE:
            return
        after = (rows[-1][1], int(rows[-1][0]))


@dataclass
class Totals:
    """The month's figures, each a positive count of what it names in the usual case: `spend`
    the sales' debits, `reversals` the refunds' and lost disputes' debits (a reversed refund or
    reinstated dispute lowers it)."""

    opening: int
    top_ups: int = 0
    spend: int = 0
    returns: int = 0
    reversals: int = 0

    def add(self, line: Line) -> None:
        if line.kind == Entry.TOP_UP:
            self.top_ups += line.amount_minor
        elif line.kind == Entry.SALE:
            self.spend -= line.amount_minor
        elif line.kind == Entry.RETURN:
            self.returns += line.amount_minor
        else:  # refund, dispute
            self.reversals -= line.amount_minor

    @property
    def closing(self) -> int:
        return self.opening + self.top_ups - self.spend + self.returns - self.reversals


def as_json(wallet: BilledWallet, period: Month, opening_minor: int) -> Iterator[str]:
    """The statement as JSON text, piece by piece: the figures of the whole month come after its
    lines, since they are added up from them. `opening_minor`: `opening(wallet, period.start)`,
    read before the answer starts (a database outage is then still a JSON 503)."""
    totals = Totals(opening_minor)
    head = {
        "buyer_id": wallet.buyer_id,
        "currency": wallet.currency,
        "month": period.label,
        "opening": money.text(totals.opening, wallet.currency),
    }
    yield json.dumps(head)[:-1] + ', "lines": ['
    first = True
    for page in lines(wallet, period):
        shown = []
        for line in page:
            totals.add(line)
            shown.append(json.dumps(_line_json(line, wallet.currency)))
        yield ("" if first else ", ") + ", ".join(shown)
        first = False
    figures = {
        name: money.text(getattr(totals, name), wallet.currency)
        for name in ("top_ups", "spend", "returns", "reversals", "closing")
    }
    yield "], " + json.dumps(figures)[1:] + "\n"


def as_csv(wallet: BilledWallet, period: Month) -> Iterator[str]:
    """The month's lines as CSV (csvsafe: amounts as numbers, text escaped against formulas),
    a header line first, a page at a time."""
    yield csv_rows([CSV_COLUMNS])
    for page in lines(wallet, period):
        yield csv_rows(
            [iso(line.at), line.kind, money.major(line.amount_minor, wallet.currency), line.reference] for line in page
        )


def csv_rows(rows: Any) -> str:
    """Rows as CSV lines, every cell through csvsafe (numbers as numbers, text escaped)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([csvsafe.cell(value) for value in row] for row in rows)
    return out.getvalue()


def _line_json(line: Line, currency: str) -> dict[str, str]:
    return {
        "at": iso(line.at),
        "kind": line.kind,
        "amount": money.text(line.amount_minor, currency),
        "reference": line.reference,
    }


def utc(at: datetime) -> datetime:
    return at.astimezone(timezone.utc).replace(tzinfo=None) if at.tzinfo is not None else at


def iso(at: datetime) -> str:
    return at.isoformat(timespec="microseconds") + "Z"


def summary(wallet: BilledWallet, period: Month, last: int) -> dict[str, Any]:
    """The month's figures, added up by the database (its days added up, wallet_days.py, and
    the rows of the days not yet), and its `last` lines, newest first: what the console's
    buyer page shows. The same figures as the full statement's, which adds up its own lines."""
    mine = (
        (WalletEntry.customer == wallet.account)
        & (WalletEntry.currency == wallet.currency)
        & (WalletEntry.at >= period.start)
        & (WalletEntry.at < period.end)
    )
    totals = Totals(opening(wallet, period.start))
    for kind, amount in wallet_days.sums(wallet.account, wallet.currency, period.start, period.end).items():
        totals.add(Line(datetime.min, _SHOWN.get(kind, kind), amount, ""))
    newest = cast(
        "Iterable[tuple[datetime, str, int, str]]",
        WalletEntry.select(WalletEntry.at, WalletEntry.kind, WalletEntry.amount_minor, WalletEntry.reference)
        .where(mine)
        .order_by(WalletEntry.at.desc(), WalletEntry.id.desc())
        .limit(last)
        .tuples(),
    )
    shown = [Line(utc(at), _SHOWN.get(kind, kind), int(amount), str(ref)) for at, kind, amount, ref in newest]
    return {
        "month": period.label,
        "currency": wallet.currency,
        **{
            name: money.text(getattr(totals, name), wallet.currency)
            for name in ("opening", "top_ups", "spend", "returns", "reversals", "closing")
        },
        "lines": [_line_json(line, wallet.currency) for line in shown],
        "more": len(shown) == last,
    }
