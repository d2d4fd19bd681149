"""Each wallet's journal added up per UTC day and kind (`wallet_days`, sql/031) for the days that
are over, so that a statement's opening balance and a month's figures read a row per day and
kind, not every journal row since the wallet began (bench/REPORT.md part 44). The days are added
up by the first read after they end: a journal row's `at` is the time it is written
(billing/wallets.py), so a day over by MARGIN gains no row later."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import date, datetime, time, timedelta
from typing import Any, cast

import peewee as pw

from webhooks.storage.records.db import db, is_mysql
from webhooks.storage.records.models import WalletDay, WalletDaysDone, WalletEntry, utcnow

MARGIN = timedelta(hours=1)  # longer than any transaction that writes a journal row


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time())


def _day(value: Any) -> date:
    """DATE() as read: a date on MySQL, its ISO text on SQLite."""
    return value if isinstance(value, date) else date.fromisoformat(str(value)[:10])


def through(customer: str, currency: str) -> date | None:
    """The last day the wallet's rows are added up to (every day before it too), after adding up
    the days that ended MARGIN ago; None when none has."""
    last = (utcnow() - MARGIN).date() - timedelta(days=1)
    mark = WalletDaysDone.get_or_none(WalletDaysDone.customer == customer, WalletDaysDone.currency == currency)
    done = None if mark is None else _day(mark.through_day)
    if done is not None and done >= last:
        return done
    mine = (WalletEntry.customer == customer) & (WalletEntry.currency == currency)
    since = mine if done is None else mine & (WalletEntry.at >= _midnight(done + timedelta(days=1)))
    day = pw.fn.DATE(WalletEntry.at)
    found = (
        WalletEntry.select(day, WalletEntry.kind, pw.fn.SUM(WalletEntry.amount_minor))
        .where(since & (WalletEntry.at < _midnight(last + timedelta(days=1))))
        .group_by(day, WalletEntry.kind)
        .tuples()
    )
    rows = [
        {"customer": customer, "currency": currency, "day": _day(d), "kind": kind, "amount_minor": int(amount)}
        for d, kind, amount in cast("Iterable[tuple[Any, str, Any]]", found)
    ]
    with db.atomic():
        if rows:  # added up again by a concurrent read: the same sums
            _upsert(WalletDay.insert_many(rows), [WalletDay.amount_minor], WalletDay._meta.indexes[0][0])
        mark_row = {"customer": customer, "currency": currency, "through_day": last}
        _upsert(WalletDaysDone.insert(mark_row), [WalletDaysDone.through_day], ("customer", "currency"))
    return last


def _upsert(query: Any, preserve: list[pw.Field], unique: tuple[str, ...]) -> None:
    if is_mysql():
        query.on_conflict(preserve=preserve).execute()  # ON DUPLICATE KEY UPDATE
    else:
        target = [getattr(query.model, name) for name in unique]
        query.on_conflict(conflict_target=target, preserve=preserve).execute()


def sums(customer: str, currency: str, start: datetime | None, end: datetime) -> dict[str, int]:
    """The wallet's rows from `start` (None: its first) to `end` (midnights, UTC), added up by
    kind: the days added up, then the rows after them, each one indexed range read."""
    done = through(customer, currency)
    cut = None if done is None else _midnight(done + timedelta(days=1))  # days before it are added up
    out: dict[str, int] = defaultdict(int)
    if cut is not None and (start is None or start < cut):
        days = (WalletDay.customer == customer) & (WalletDay.currency == currency)
        days &= WalletDay.day < min(end, cut).date()
        if start is not None:
            days &= WalletDay.day >= start.date()
        query = WalletDay.select(WalletDay.kind, pw.fn.SUM(WalletDay.amount_minor)).where(days)
        for kind, amount in cast("Iterable[tuple[str, Any]]", query.group_by(WalletDay.kind).tuples()):
            out[kind] += int(amount or 0)
    after = max(start, cut) if start is not None and cut is not None else (cut or start)
    if after is None or after < end:
        rows = (WalletEntry.customer == customer) & (WalletEntry.currency == currency) & (WalletEntry.at < end)
        if after is not None:
            rows &= WalletEntry.at >= after
        raw = WalletEntry.select(WalletEntry.kind, pw.fn.SUM(WalletEntry.amount_minor)).where(rows)
        for kind, amount in cast("Iterable[tuple[str, Any]]", raw.group_by(WalletEntry.kind).tuples()):
            out[kind] += int(amount or 0)
    return dict(out)
