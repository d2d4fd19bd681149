"""The ledger's payments as the console lists them: newest first by (received_at, id) under a
keyset, filtered by provider, currency, wallet, status and time received (sql/032's indexes
serve the order, alone or after a wallet), a page at a time or every one for a CSV; and one
wallet as the ledger holds it: its balances, its payments and the moves of its journal."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import peewee as pw

from webhooks.formats import csvsafe, money
from webhooks.storage.records.models import Payment, Wallet, WalletEntry

CSV_PAGE = 1000  # rows read per query of a CSV: its memory stays bounded however many match
CSV_COLUMNS = (
    "received_at",
    "provider",
    "reference",
    "status",
    "wallet",
    "currency",
    "amount",
    "fees",
    "refunded",
    "disputed",
    "credited_at",
    "source",
    "flag",
    "event_type",
)


@dataclass(frozen=True, kw_only=True)
class PaymentQuery:
    """The filters of a search; `since` inclusive, `until` exclusive, both naive UTC."""

    provider: str | None = None
    currency: str | None = None
    customer: str | None = None  # the wallet
    status: str | None = None
    since: datetime | None = None
    until: datetime | None = None


Key = tuple[datetime, int]  # a payment's place in the list: (received_at, id)


def _where(query: PaymentQuery, after: Key | None) -> list[pw.Expression]:
    conds: list[pw.Expression] = []
    if query.customer is not None:
        conds.append(Payment.customer == query.customer)
    if query.currency is not None:
        conds.append(Payment.currency == query.currency)
    if query.provider is not None:
        conds.append(Payment.provider == query.provider)
    if query.status is not None:
        conds.append(Payment.status == query.status)
    if query.since is not None:
        conds.append(Payment.received_at >= query.since)
    if query.until is not None:
        conds.append(Payment.received_at < query.until)
    if after is not None:
        # (received_at, id) < after, written so that both engines read it as a range of the index
        at, row_id = after
        conds.append(Payment.received_at <= at)
        conds.append((Payment.received_at < at) | (Payment.id < row_id))
    return conds


def page(query: PaymentQuery, *, limit: int, after: Key | None = None) -> tuple[list[Payment], Key | None]:
    """`limit` payments from `after` on, newest first, and the key of the last when more follow."""
    select = Payment.select()
    conds = _where(query, after)
    if conds:
        select = select.where(*conds)
    rows = list(select.order_by(Payment.received_at.desc(), Payment.id.desc()).limit(limit + 1))
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], (last.received_at, last.id)


def shown(p: Payment) -> dict[str, Any]:
    """A payment as a row of the list: its amounts in the currency's units (None for none)."""
    return {
        "key": f"{p.provider}:{p.reference}",
        "provider": p.provider,
        "reference": p.reference,
        "status": p.status,
        "wallet": p.customer or None,
        "currency": p.currency,
        "amount": money.text(p.amount_minor, p.currency),
        "fees": _nonzero(p.fees_minor, p.currency),
        "refunded": _nonzero(p.refunded_minor, p.currency),
        "disputed": _nonzero(p.disputed_minor, p.currency),
        "received_at": p.received_at.isoformat(sep=" ", timespec="seconds"),
        "credited_at": None if p.credited_at is None else p.credited_at.isoformat(sep=" ", timespec="seconds"),
        "source": p.source,
        "flag": p.flag,
        "event_type": p.event_type,
    }


def _nonzero(minor: int, currency: str) -> str | None:
    return money.text(minor, currency) if minor else None


def csv_lines(query: PaymentQuery) -> Iterator[str]:
    """Every payment the query matches as CSV, newest first: the header, then a page of
    CSV_PAGE rows per read (amounts as numbers, text escaped against formulas: csvsafe)."""
    header, after = True, None
    while True:
        rows, after = page(query, limit=CSV_PAGE, after=after)
        text = csvsafe.write(CSV_COLUMNS, map(_csv_row, rows))
        yield text if header else text.split("\n", 1)[1]
        header = False
        if after is None:
            return


def _csv_row(p: Payment) -> list[Any]:
    """A payment's CSV cells in CSV_COLUMNS' order: the amounts as Decimals (numbers)."""
    row = shown(p)
    for name, minor in (
        ("amount", p.amount_minor),
        ("fees", p.fees_minor),
        ("refunded", p.refunded_minor),
        ("disputed", p.disputed_minor),
    ):
        row[name] = money.major(minor, p.currency)
    return [row[name] for name in CSV_COLUMNS]


@dataclass(frozen=True, kw_only=True)
class WalletView:
    customer: str
    balances: dict[str, int]  # minor units per currency, as the wallets table holds them
    payments: list[Payment]  # newest first
    moves: list[WalletEntry]  # the journal, newest first: top-ups, sales, returns, refunds, disputes


def wallet(customer: str, currency: str | None, limit: int) -> WalletView:
    """One wallet (of every currency it holds, or of `currency`): its balances, its newest
    `limit` payments and journal moves. Each read is a range of an index that starts with the
    wallet (wallets, payments: sql/032, wallet_entries: sql/016)."""
    balances = Wallet.select(Wallet.currency, Wallet.balance_minor).where(Wallet.customer == customer)
    payments = Payment.select().where(Payment.customer == customer)
    moves = WalletEntry.select().where(WalletEntry.customer == customer)
    if currency is not None:
        balances = balances.where(Wallet.currency == currency)
        payments = payments.where(Payment.currency == currency)
        moves = moves.where(WalletEntry.currency == currency)
    return WalletView(
        customer=customer,
        balances={row.currency: row.balance_minor for row in balances.order_by(Wallet.currency)},
        payments=list(payments.order_by(Payment.received_at.desc(), Payment.id.desc()).limit(limit)),
        moves=list(moves.order_by(WalletEntry.at.desc(), WalletEntry.id.desc()).limit(limit)),
    )
