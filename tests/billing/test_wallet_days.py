"""A wallet's journal added up per day (billing/wallet_days.py): a statement's opening balance and
month figures read from the days added up agree with its lines added up one by one, before and
after the days are added up, and a row of today counts at once."""

from __future__ import annotations

from datetime import timedelta

from tests.billing.test_statement import ACCOUNT, NOVEMBER, SALE, TOP_UP, billed, get_statement, move
from webhooks.billing import statement, wallet_days
from webhooks.storage.records.db import db
from webhooks.storage.records.models import WalletDay, WalletDaysDone, utcnow

FIGURES = ("opening", "top_ups", "spend", "returns", "reversals", "closing")


def summary(month: str) -> dict:
    """The month's figures as the console's buyer page reads them (statement.summary)."""
    with db.connection_context():
        wallet = statement.billed_wallet("acme")
        return statement.summary(wallet, statement.month(month, utcnow().date()), 5)


def test_the_days_added_up_give_the_figures_of_the_lines_added_up(api, buyer_server):
    billed(api, buyer_server)
    for row in NOVEMBER:
        move(*row)
    now = utcnow()
    this_month = now.strftime("%Y-%m")
    move(now.strftime("%Y-%m-%dT00:00:00"), TOP_UP, 5000, "stripe:today")  # a day not over yet
    for month in ("2025-10", "2025-11", "2025-12", this_month):
        lines_added_up = get_statement(api, month)  # the full statement adds up its own lines
        assert {k: summary(month)[k] for k in FIGURES} == {k: lines_added_up[k] for k in FIGURES}, month
    with db.connection_context():
        days = {(r.day.isoformat(), r.kind): r.amount_minor for r in WalletDay.select()}
        done = WalletDaysDone.get(WalletDaysDone.customer == ACCOUNT).through_day
    assert days[("2025-11-05", "sale")] == -1250 and days[("2025-11-30", "sale")] == -100
    assert ("2025-11-30", "sale") in days and done >= (now - timedelta(days=2)).date()
    assert all(day < now.date().isoformat() for day, _ in days)  # today's rows are read as rows


def test_a_row_written_after_the_days_were_added_up_counts_at_once(api, buyer_server):
    billed(api, buyer_server)
    move("2025-11-05T10:00:00", TOP_UP, 10000, "stripe:pi_1")
    this_month = utcnow().strftime("%Y-%m")
    before = summary(this_month)
    assert before["opening"] == "100.00"
    move(utcnow().strftime("%Y-%m-%dT%H:%M:%S"), SALE, -1250, "lead:surge:n1")
    after = summary(this_month)
    assert (after["opening"], after["spend"], after["closing"]) == ("100.00", "12.50", "87.50")
    with db.connection_context():
        assert wallet_days.through(ACCOUNT, "USD") == WalletDaysDone.get().through_day
