"""Calendar windows and opening hours in the buyer's time zone, DST days included."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from webhooks.caps.windows import window
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage.records.models import Buyer

CHICAGO = ZoneInfo("America/Chicago")
UTC = timezone.utc


def test_day_window_is_local_midnight_to_midnight():
    # 05:30 UTC on Nov 29 is still Nov 28 in Chicago (UTC-6)
    w = window("daily", CHICAGO, datetime(2026, 11, 29, 5, 30, tzinfo=UTC))
    assert w.label == "2026-11-28"
    assert w.start == datetime(2026, 11, 28, 6, 0, tzinfo=UTC)
    assert w.end == datetime(2026, 11, 29, 6, 0, tzinfo=UTC)


def test_window_rolls_over_at_local_midnight():
    before = window("daily", CHICAGO, datetime(2026, 11, 29, 5, 59, 59, tzinfo=UTC))
    after = window("daily", CHICAGO, datetime(2026, 11, 29, 6, 0, 0, tzinfo=UTC))
    assert before.label == "2026-11-28" and after.label == "2026-11-29"
    assert before.end == after.start


def test_dst_days_are_23_and_25_hours_long():
    spring = window("daily", CHICAGO, datetime(2026, 3, 8, 18, 0, tzinfo=UTC))
    fall = window("daily", CHICAGO, datetime(2026, 11, 1, 18, 0, tzinfo=UTC))
    assert spring.end - spring.start == timedelta(hours=23)
    assert fall.end - fall.start == timedelta(hours=25)


def test_repeated_fall_back_hour_is_two_hourly_windows():
    first = window("hourly", CHICAGO, datetime(2026, 11, 1, 6, 30, tzinfo=UTC))  # 01:30 CDT
    second = window("hourly", CHICAGO, datetime(2026, 11, 1, 7, 30, tzinfo=UTC))  # 01:30 CST
    assert first.label != second.label
    assert first.end == second.start


def test_half_hour_zone_hour_starts_at_half_past_utc():
    w = window("hourly", ZoneInfo("Asia/Kolkata"), datetime(2026, 11, 29, 10, 45, tzinfo=UTC))
    assert w.start == datetime(2026, 11, 29, 10, 30, tzinfo=UTC)


def test_week_starts_monday_and_month_on_the_first_local():
    w = window("weekly", CHICAGO, datetime(2026, 11, 29, 12, 0, tzinfo=UTC))  # a Sunday
    assert w.label == "2026-11-23" and w.end - w.start == timedelta(days=7)
    m = window("monthly", CHICAGO, datetime(2026, 12, 1, 3, 0, tzinfo=UTC))  # still Nov 30 local
    assert m.label == "2026-11"
    assert m.end == datetime(2026, 12, 1, 6, 0, tzinfo=UTC)


def _rule(schedule, tz="America/Chicago"):
    row = Buyer(
        id="b",
        endpoint_url="http://x",
        priority=1,
        price="1.00",
        timezone=tz,
        states="[]",
        blocked_publishers="[]",
        schedule=None if schedule is None else json.dumps(schedule),
    )  # unsaved: defaults apply
    return BuyerRule.from_row(row)


def test_schedule_is_half_open_in_local_time():
    b = _rule({"mon": [["09:00", "17:00"]]})
    monday = datetime(2026, 11, 30, tzinfo=CHICAGO)
    assert not b.is_open(monday.replace(hour=8, minute=59))
    assert b.is_open(monday.replace(hour=9))
    assert b.is_open(monday.replace(hour=16, minute=59))
    assert not b.is_open(monday.replace(hour=17))
    assert not b.is_open(datetime(2026, 12, 1, 10, tzinfo=CHICAGO))  # tuesday: not listed, closed
    # 15:30 UTC is 09:30 in Chicago: open, though it would be closed if read as UTC
    assert b.is_open(datetime(2026, 11, 30, 15, 30, tzinfo=UTC))


def test_schedule_until_midnight_and_across_dst():
    b = _rule({"sun": [["00:00", "02:30"], ["20:00", "24:00"]]})
    # 2026-03-08: 02:00 local does not exist; 07:59 UTC is 01:59 CST, 08:00 UTC is 03:00 CDT
    assert b.is_open(datetime(2026, 3, 8, 7, 59, tzinfo=UTC))
    assert not b.is_open(datetime(2026, 3, 8, 8, 0, tzinfo=UTC))
    # 2026-11-01: 01:30 happens twice and is open both times
    assert b.is_open(datetime(2026, 11, 1, 6, 30, tzinfo=UTC))
    assert b.is_open(datetime(2026, 11, 1, 7, 30, tzinfo=UTC))
    assert b.is_open(datetime(2026, 11, 1, 23, 59, tzinfo=CHICAGO))
    assert not b.is_open(datetime(2026, 11, 2, 0, 0, tzinfo=CHICAGO))  # a monday


def test_no_schedule_is_always_open():
    row_rule = _rule(None)
    assert row_rule.schedule is None and row_rule.is_open(datetime.now(UTC))
