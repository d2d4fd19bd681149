"""A publisher's pre-ping quota (`precheck`, docs/leads.md "Pre-ping quota"): its validation
and stored form, the hourly counters lua/take_precheck.lua reads and takes from, and the 429
over it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, NoReturn

from webhooks import metrics
from webhooks.errors import RateLimited, ValidationError
from webhooks.formats import validate as v
from webhooks.storage.live import keys

if TYPE_CHECKING:
    from webhooks.storage.live.batch import Batch, Pending
    from webhooks.storage.live.scripts import Prechecked
    from webhooks.storage.records.models import Publisher

CODE = "invalid_publisher"
HOURS = 24  # the window: this UTC hour and the 23 before it (between 23 and 24 hours back)
PER_LEAD_MAX = 100_000
FLOOR_MAX = 10**9
_MEMBERS = ("per_lead", "daily_floor")


@dataclass(frozen=True, kw_only=True)
class Quota:
    """Pre-pings a publisher may make in the window: `daily_floor` + `per_lead` x its leads."""

    per_lead: int = 10
    daily_floor: int = 1000

    def to_json(self) -> dict[str, int]:
        return {"per_lead": self.per_lead, "daily_floor": self.daily_floor}


DEFAULT = Quota()


def parse(value: Any) -> Quota:
    """`precheck`: {"per_lead": 0..PER_LEAD_MAX, "daily_floor": 0..FLOOR_MAX}; absent or null
    (the whole object or a member): the default."""
    if value is None:
        return DEFAULT
    if not isinstance(value, dict):
        raise ValidationError(CODE, "precheck", 'must be an object {"per_lead": n, "daily_floor": n}')
    for key in value:
        if key not in _MEMBERS:
            raise ValidationError(CODE, f"precheck.{str(key)[:64]}", "unknown field; use per_lead, daily_floor")
    per_lead, floor = value.get("per_lead"), value.get("daily_floor")
    return Quota(
        per_lead=DEFAULT.per_lead
        if per_lead is None
        else v.integer(CODE, "precheck.per_lead", per_lead, low=0, high=PER_LEAD_MAX),
        daily_floor=DEFAULT.daily_floor
        if floor is None
        else v.integer(CODE, "precheck.daily_floor", floor, low=0, high=FLOOR_MAX),
    )


def columns(quota: Quota) -> dict[str, int]:
    return {"precheck_per_lead": quota.per_lead, "precheck_daily_floor": quota.daily_floor}


def of_row(row: Publisher) -> Quota:
    """The stored quota (a column left NULL, as rows made before it are: the default)."""
    per_lead, floor = row.precheck_per_lead, row.precheck_daily_floor
    return Quota(
        per_lead=DEFAULT.per_lead if per_lead is None else int(per_lead),
        daily_floor=DEFAULT.daily_floor if floor is None else int(floor),
    )


def hours(now: datetime) -> list[str]:
    """The window's UTC hours as cap keys name them (leads/rules/publishers.py:cap_windows),
    this hour first."""
    hour = now.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    return [(hour - timedelta(hours=i)).strftime("%Y-%m-%dT%H") for i in range(HOURS)]


def counters(publisher_id: str, now: datetime) -> tuple[list[str], list[str]]:
    """(leads posted, pre-pings) per hour of the window, this hour first."""
    window = hours(now)
    return (
        [keys.publisher_cap(publisher_id, "hourly", h) for h in window],
        [keys.publisher_prechecks(publisher_id, h) for h in window],
    )


def take(batch: Batch, publisher_id: str, quota: Quota, now: datetime) -> Pending[Prechecked]:
    """Queue the taking of one pre-ping from the quota on `batch`."""
    posted, prechecks = counters(publisher_id, now)
    return batch.take_precheck(
        posted, prechecks, per_lead=quota.per_lead, daily_floor=quota.daily_floor, ttl_s=(HOURS + 1) * 3600
    )


def refuse(publisher_id: str, got: Prechecked, now: datetime) -> NoReturn:
    """429 precheck_quota, Retry-After: to the first hour boundary at which one would fit."""
    metrics.prechecked(publisher_id, "refused")
    hour = now.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    wait_s = math.ceil((hour + timedelta(hours=got.wait_hours) - now).total_seconds())
    raise RateLimited(
        f"this publisher's pre-ping quota ({got.quota} in the last {HOURS} hours) is used up; posted leads raise it",
        retry_after_s=wait_s,
        code="precheck_quota",
    )


def usage(quota: Quota, posted: Sequence[Any], prechecks: Sequence[Any], now: datetime) -> dict[str, Any]:
    """{"used", "limit", "window_start"} from the window's counters as read (GET replies)."""
    leads = sum(int(x or 0) for x in posted)
    return {
        "used": sum(int(x or 0) for x in prechecks),
        "limit": quota.daily_floor + quota.per_lead * leads,
        "window_start": hours(now)[-1],
    }
