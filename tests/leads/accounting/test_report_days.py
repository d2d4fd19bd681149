"""The leads report's days (lead_stats_days) beside its hours (lead_stats): every change counted
in both, in the same transaction, a day's row the sum of its hours' rows; a report of whole
days read from the days has the figures the hours add up to."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhooks.leads.accounting import reports
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, LeadStats, LeadStatsDay

# A month no other test counts leads in: each example starts it empty.
FIRST = date(2001, 3, 1)
LAST = date(2001, 3, 3)
START = datetime(2001, 3, 1)


def _clear() -> None:
    LeadStats.delete().where(LeadStats.hour >= START, LeadStats.hour < START + timedelta(days=3)).execute()
    LeadStatsDay.delete().where(LeadStatsDay.day >= FIRST, LeadStatsDay.day <= LAST).execute()


def _days_from_hours() -> dict[tuple[str, str, str], tuple[Any, ...]]:
    summed: dict[tuple[str, str, str], list[Any]] = {}
    for row in LeadStats.select().where(LeadStats.hour >= START, LeadStats.hour < START + timedelta(days=3)):
        sums = summed.setdefault((row.hour.date().isoformat(), row.publisher_id, row.buyer_id), [0] * 9)
        for i, name in enumerate(reports.SUMMED):
            sums[i] += getattr(row, name) or 0
    return {key: tuple(Decimal(v).quantize(Decimal("0.01")) for v in sums) for key, sums in summed.items()}


def _days() -> dict[tuple[str, str, str], tuple[Any, ...]]:
    return {
        (str(row.day), row.publisher_id, row.buyer_id): tuple(
            Decimal(getattr(row, name)).quantize(Decimal("0.01")) for name in reports.SUMMED
        )
        for row in LeadStatsDay.select().where(LeadStatsDay.day >= FIRST, LeadStatsDay.day <= LAST)
    }


def _lead(hour: datetime, publisher_id: str) -> Lead:
    return Lead(publisher_id=publisher_id, lead_id="x", received_at=hour)


def test_a_return_and_a_conversion_are_counted_in_their_hour_and_their_day(database_url):
    hour = START + timedelta(hours=13)
    with db.connection_context(), db.atomic():
        _clear()
        reports.count_conversion(hour, publisher_id="surge", buyer_id="acme")
        reports.count_returned(_lead(hour, "surge"), price=Decimal("10.00"), payout=Decimal("1.00"), buyer_id="acme")
        reports.count_conversion(hour + timedelta(hours=2), publisher_id="surge", buyer_id="acme")
        hours = {
            r.hour: (r.returned, r.revenue, r.payout, r.conversions)
            for r in LeadStats.select().where(LeadStats.publisher_id == "surge", LeadStats.hour >= START)
        }
        day = LeadStatsDay.get(LeadStatsDay.day == FIRST, LeadStatsDay.publisher_id == "surge")
        assert hours == {
            hour: (1, Decimal("-10.00"), Decimal("-1.00"), 1),
            hour + timedelta(hours=2): (0, Decimal("0.00"), Decimal("0.00"), 1),
        }
        assert (day.buyer_id, day.returned, day.revenue, day.payout, day.conversions) == (
            "acme",
            1,
            Decimal("-10.00"),
            Decimal("-1.00"),
            2,
        )
        assert _days() == _days_from_hours()
        _clear()


CHANGES = st.lists(
    st.tuples(
        st.integers(0, 71),  # the lead's hour in the three days
        st.sampled_from(["pub-a", "pub-b"]),
        st.sampled_from(["acme", "zen", ""]),
        st.booleans(),  # a return (else a conversion)
        st.decimals(Decimal("0.01"), Decimal("999.99"), places=2),
    ),
    max_size=25,
)


@given(changes=CHANGES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_day_is_the_sum_of_its_hours_and_reports_so(database_url, changes):
    with db.connection_context(), db.atomic():
        _clear()
        for offset, publisher_id, buyer_id, returned, price in changes:
            hour = START + timedelta(hours=offset)
            if returned:
                reports.count_returned(
                    _lead(hour, publisher_id),
                    price=price,
                    payout=(price / 10).quantize(Decimal("0.01")),
                    buyer_id=buyer_id,
                )
            else:
                reports.count_conversion(hour, publisher_id=publisher_id, buyer_id=buyer_id)
        assert _days() == _days_from_hours()
        by_hour = reports.report(FIRST, LAST, "hour")
        by_day = reports.report(FIRST, LAST, "day")
        assert by_day["totals"] == by_hour["totals"]
        for group_by in ("publisher", "buyer"):
            assert reports.report(FIRST, LAST, group_by)["totals"] == by_hour["totals"]
        folded: dict[str, list[Any]] = {}
        for row in by_hour["rows"]:
            sums = folded.setdefault(row["key"][:10], [0] * 4)
            for i, name in enumerate(("returned", "revenue", "payout", "conversions")):
                sums[i] += row[name]
        assert {r["key"]: [r["returned"], r["revenue"], r["payout"], r["conversions"]] for r in by_day["rows"]} == {
            k: [v[0], Decimal(v[1]).quantize(Decimal("0.01")), Decimal(v[2]).quantize(Decimal("0.01")), v[3]]
            for k, v in folded.items()
        }
        _clear()


@pytest.mark.parametrize("group_by", ["day", "publisher", "buyer"])
def test_a_buyers_row_of_whole_days_is_its_row_of_the_report_by_buyer(database_url, group_by):
    hour = START + timedelta(hours=5)
    with db.connection_context(), db.atomic():
        _clear()
        for buyer_id, price in (("acme", "10.00"), ("zen", "20.00"), ("acme", "5.50")):
            reports.count_returned(_lead(hour, "surge"), price=Decimal(price), payout=None, buyer_id=buyer_id)
        rows = {r["key"]: r for r in reports.report(FIRST, LAST, "buyer")["rows"]}
        mine = reports.report(FIRST, LAST, group_by, buyer_id="acme")
        assert mine["totals"] == {k: v for k, v in rows["acme"].items() if k != "key"}
        _clear()


def test_days_counted_only_in_their_hours_are_made_again_by_the_command(database_url, app):
    """A process of the release before sql/034 counts in the hours only; `leads
    rebuild-report-days` makes each day again from its hours, and is safe to run twice."""
    hour = START + timedelta(hours=5)
    with db.connection_context():
        _clear()
        with db.atomic():
            reports.count_conversion(hour, publisher_id="surge", buyer_id="acme")
        # the old process: its hour, and none of its day
        LeadStats.update(leads=LeadStats.leads + 3, sold=LeadStats.sold + 2).where(LeadStats.hour == hour).execute()
        LeadStats.insert(
            hour=hour + timedelta(days=1),
            publisher_id="surge",
            buyer_id="bolt",
            leads=4,
            sold=1,
            returned=0,
            revenue=Decimal("7.50"),
            payout=Decimal("0.75"),
            sales=1,
            offers=2,
            accepted=1,
            conversions=0,
        ).execute()
        assert _days() != _days_from_hours()
    for _ in range(2):
        result = app.test_cli_runner().invoke(
            args=["leads", "rebuild-report-days", FIRST.isoformat(), "--until", LAST.isoformat()]
        )
        assert result.exit_code == 0, result.output
    with db.connection_context():
        assert _days() == _days_from_hours()
        assert _days()[("2001-03-02", "surge", "bolt")][0] == 4
        _clear()
