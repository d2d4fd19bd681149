"""Calendar cap windows in the buyer's time zone: hour, day, ISO week (Monday), month.

Each window has a key suffix naming its local start and the UTC instant it ends, so a counter
expires with its window rather than an hour after its first lead (the seed's rolling window).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

COUNT_CAPS = ("hourly", "daily", "weekly", "monthly")
CAPS = COUNT_CAPS + ("daily_budget",)


@dataclass(frozen=True)
class Window:
    cap: str
    label: str  # local start, part of the counter's key
    start: datetime  # aware, UTC
    end: datetime  # aware, UTC


def _local_midnight(day: date, tz: ZoneInfo) -> datetime:
    return datetime.combine(day, time(0), tzinfo=tz).astimezone(timezone.utc)


def window(cap: str, tz: ZoneInfo, now: datetime) -> Window:
    """The window of `cap` that contains `now` (aware) in time zone `tz`.

    Windows start and end on whole minutes (UTC offsets and DST changes are whole minutes),
    so the window of `now` is the window of its minute, computed once per minute."""
    return _window_of_minute(cap, tz, int(now.timestamp()) // 60)


@functools.lru_cache(maxsize=8192)
def _window_of_minute(cap: str, tz: ZoneInfo, minute: int) -> Window:
    local = datetime.fromtimestamp(minute * 60, timezone.utc).astimezone(tz)
    if cap == "hourly":
        # Whole-hour steps in UTC from the local hour start: correct for the repeated hour of a
        # DST fall-back (two distinct windows, told apart by their offset) and for :30 zones.
        start_local = local.replace(minute=0, second=0, microsecond=0)
        start = start_local.astimezone(timezone.utc)
        label = start_local.strftime("%Y-%m-%dT%H%z")
        return Window(cap, label, start, start + timedelta(hours=1))
    if cap in ("daily", "daily_budget"):
        day = local.date()
        return Window(cap, day.isoformat(), _local_midnight(day, tz), _local_midnight(day + timedelta(days=1), tz))
    if cap == "weekly":
        monday = local.date() - timedelta(days=local.weekday())
        return Window(
            cap, monday.isoformat(), _local_midnight(monday, tz), _local_midnight(monday + timedelta(days=7), tz)
        )
    if cap == "monthly":
        first = local.date().replace(day=1)
        following = (first + timedelta(days=32)).replace(day=1)
        return Window(cap, first.strftime("%Y-%m"), _local_midnight(first, tz), _local_midnight(following, tz))
    raise ValueError(f"unknown cap {cap!r}")
