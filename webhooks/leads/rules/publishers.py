"""Publishers: admin validation, stored form, API-key lookup by hash, and the rate limit."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from webhooks import metrics
from webhooks.errors import Checks, RateLimited, ValidationError
from webhooks.formats import validate as v
from webhooks.leads.rules import consent, earnings, precheck_quota, quality, suppression
from webhooks.storage.live import keys
from webhooks.storage.live.scripts import CapCounter
from webhooks.storage.records.models import Publisher

if TYPE_CHECKING:
    from webhooks.storage.live.redis import Store

CODE = "invalid_publisher"
_FIELDS = {
    "name",
    "api_key",
    "commission_pct",
    "payout",
    "active",
    "routing",
    "rate_limit",
    "fields",
    "mode",
    "caps",
    "suppress",
    "precheck",
    "payout_hold_days",
    "sell",
    "epl_window_days",
}
PUBLISHER_CAPS = {"hourly": 3600, "daily": 86400}  # UTC windows, by their length in seconds
CAP_MAX = 10**9
UNCAPPED = ("hourly", CAP_MAX + 1)  # the hourly lead counter of a publisher without an hourly cap
MODES = ("live", "test")  # test: every lead of the publisher is a test lead
RATE_MAX = 100_000  # per_second and burst: 1..RATE_MAX (PUBLISHER_RATE_LIMIT too)
ROUTING_MODES = ("waterfall", "price", "round_robin", "weighted", "epl")
_READ_ONLY = {"id", "api_key_hint", "balance", "held", "payable", "usage", "created_at", "updated_at"}
HOLD_DAYS_MAX = 365
MAX_SALES = 10  # `sell.max_sales`: buyers one lead may be sold to (an answer remembers each)


def key_hash(api_key: str) -> str:
    """Only a hash of an API key is stored; lookups hash the presented key."""
    return hashlib.sha256(api_key.encode()).hexdigest()


def parse(body: Any, stored: Publisher | None = None) -> dict[str, Any]:
    """Validate an admin PUT body (or a PATCH merged onto the `stored` publisher, whose API key
    is kept when the body names none: it is stored hashed, GET cannot show it); return the
    column values of the Publisher row."""
    body = v.fields(CODE, body, _FIELDS, _READ_ONLY, ())
    check = Checks()
    check.require(CODE, body, ("name",) if stored is not None else ("name", "api_key"))
    key = {"api_key_hash": None if stored is None else stored.api_key_hash}
    key["api_key_hint"] = None if stored is None else stored.api_key_hint
    if "api_key" in body or stored is None:
        api_key = check.run(None, v.text, CODE, "api_key", body.get("api_key"), min_len=16, max_len=200)
        if api_key is not None:
            key = {"api_key_hash": key_hash(api_key), "api_key_hint": api_key[-4:]}
    pct = check.run(
        Decimal(0), v.money, CODE, "commission_pct", body.get("commission_pct", "0"), max_value=Decimal(100)
    )
    payout = check.run((pct, None), _payout_of, body, pct)
    columns = {
        "name": check.run("", v.text, CODE, "name", body.get("name"), max_len=200),
        **key,
        "commission_pct": payout[0],
        "payout_fixed": payout[1],
        "active": check.run(True, v.boolean, CODE, "active", body.get("active", True)),
        "routing": check.run("waterfall", _routing, body.get("routing", "waterfall")),
        **_rate_columns(check.run(None, rate_limit, body.get("rate_limit"))),
        "mode": check.run("live", _mode, body.get("mode", "live")),
        **{f"cap_{name}": limit for name, limit in check.run({}, _caps, body.get("caps")).items()},
        "fields_spec": None
        if (spec := check.run(None, _spec, body.get("fields"), stored)) is None
        else json.dumps(spec.to_json()),
        "suppress": check.run(
            None, lambda: suppression.stored_json(suppression.parse_ids(CODE, "suppress", body.get("suppress")))
        ),
        **precheck_quota.columns(check.run(precheck_quota.DEFAULT, precheck_quota.parse, body.get("precheck"))),
        "payout_hold_days": check.run(0, _hold_days, body.get("payout_hold_days")),
        "max_sales": check.run(1, _max_sales, body.get("sell")),
        "epl_window_days": check.run(7, _window_days, body.get("epl_window_days")),
    }
    check.done()
    return columns


def _payout_of(body: dict[str, Any], pct: Decimal) -> tuple[Decimal, Decimal | None]:
    """(percentage, fixed amount or None): `payout` when given (it wins; a GET's commission_pct
    put back must agree with a percent one), else `commission_pct`."""
    if body.get("payout") is None:
        return pct, None
    paid_pct, fixed = _payout(body["payout"])
    if fixed is None and "commission_pct" in body and pct != paid_pct:
        raise ValidationError(CODE, "payout", "a percent payout and commission_pct disagree; give one")
    return paid_pct, fixed


def _window_days(value: Any) -> int:
    """`epl_window_days`: the whole days 1..90 `epl` routing ranks by; absent or null: 7."""
    if value is None:
        return 7
    return v.integer(CODE, "epl_window_days", value, low=1, high=earnings.WINDOW_DAYS_MAX)


def _max_sales(value: Any) -> int:
    """`sell`: {"max_sales": n}, the buyers one lead may be sold to, 1..MAX_SALES (absent or null:
    1, every lead exclusive)."""
    if value is None:
        return 1
    if not isinstance(value, dict):
        raise ValidationError(CODE, "sell", 'must be an object {"max_sales": n}')
    for key in value:
        if key != "max_sales":
            raise ValidationError(CODE, f"sell.{str(key)[:64]}", "unknown field; use max_sales")
    if value.get("max_sales") is None:
        return 1
    return v.integer(CODE, "sell.max_sales", value["max_sales"], low=1, high=MAX_SALES)


def _hold_days(value: Any) -> int:
    """`payout_hold_days`: whole days 0..HOLD_DAYS_MAX a sale's payout is held; absent or null
    (an emptied form field too): 0, payable at once."""
    if value is None:
        return 0
    return v.integer(CODE, "payout_hold_days", value, low=0, high=HOLD_DAYS_MAX)


def _payout(value: Any) -> tuple[Decimal, Decimal | None]:
    """(percentage, fixed amount or None) of a `payout`: {"type": "percent", "pct": "10"} or
    {"type": "fixed", "amount": "3.00"}."""
    if not isinstance(value, dict) or value.get("type") not in ("percent", "fixed"):
        raise ValidationError(CODE, "payout.type", 'must be "percent" or "fixed"')
    kind = value["type"]
    wanted = {"type", "pct"} if kind == "percent" else {"type", "amount"}
    for key in value:
        if key not in wanted:
            raise ValidationError(CODE, f"payout.{str(key)[:64]}", f"unknown field for a {kind} payout")
    if kind == "percent":
        return v.money(CODE, "payout.pct", value.get("pct", "0"), max_value=Decimal(100)), None
    if "amount" not in value:
        raise ValidationError(CODE, "payout.amount", "is required")
    return Decimal(0), v.money(CODE, "payout.amount", value["amount"], max_value=Decimal(1_000_000))


def payout_json(pct: Decimal, fixed: Decimal | None) -> dict[str, Any]:
    if fixed is not None:
        return {"type": "fixed", "amount": f"{fixed:.2f}"}
    return {"type": "percent", "pct": f"{pct:.2f}"}


def _caps(value: Any) -> dict[str, int | None]:
    """{"hourly": n, "daily": n}: leads accepted from the publisher per UTC hour / day (0 to
    10^9; absent or null: unlimited)."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValidationError(CODE, "caps", 'must be an object {"hourly": n, "daily": n}')
    for key in value:
        if key not in PUBLISHER_CAPS:
            raise ValidationError(CODE, f"caps.{str(key)[:64]}", "unknown cap; use hourly, daily")
    return {
        name: None if value.get(name) is None else v.integer(CODE, f"caps.{name}", value[name], low=0, high=CAP_MAX)
        for name in PUBLISHER_CAPS
    }


def cap_windows(now: datetime) -> dict[str, tuple[str, datetime]]:
    """Each publisher cap's current UTC window: (its name, its end)."""
    utc = now.astimezone(timezone.utc)
    hour = utc.replace(minute=0, second=0, microsecond=0)
    day = hour.replace(hour=0)
    return {
        "hourly": (hour.strftime("%Y-%m-%dT%H"), hour + timedelta(hours=1)),
        "daily": (day.strftime("%Y-%m-%d"), day + timedelta(days=1)),
    }


def cap_counters(publisher: PublisherRule, now: datetime) -> tuple[CapCounter, ...]:
    """The publisher's counters of the windows of `now` that lua/claim_lead.lua counts a lead
    in: its caps' in order, then the hourly one when it has no hourly cap (with no limit).
    The hourly counters, kept for a day, are its leads of the last 24 hours that its pre-ping
    quota grows with (leads/rules/precheck_quota.py)."""
    windows = cap_windows(now)
    caps = publisher.caps if any(name == "hourly" for name, _ in publisher.caps) else (*publisher.caps, UNCAPPED)
    out = []
    for name, limit in caps:
        window, end = windows[name]
        kept_s = precheck_quota.HOURS * 3600 if name == "hourly" else 3600
        ttl_s = int((end - now).total_seconds()) + kept_s  # outlives its window, then goes
        out.append(CapCounter(keys.publisher_cap(publisher.id, name, window), limit, ttl_s))
    return tuple(out)


def cap_usage_many(
    store: Store, publishers: Sequence[PublisherRule], now: datetime
) -> dict[str, dict[str, dict[str, Any]]]:
    """The use of each cap of many publishers, by id ({"hourly": {"used", "limit",
    "window_start"}, ...}: GET /v1/admin/publishers), read in one round trip (GETs in a pipeline: a
    Redis Cluster's pipeline refuses MGET); "precheck" among them: its pre-ping quota's use."""
    windows = cap_windows(now)
    counters = [[c.key for c in cap_counters(publisher, now)[: len(publisher.caps)]] for publisher in publishers]
    quotas = [precheck_quota.counters(publisher.id, now) for publisher in publishers]
    pipe = store.redis.pipeline(transaction=False)
    for its, (posted, prechecks) in zip(counters, quotas):
        for key in (*its, *posted, *prechecks):
            pipe.get(key)
    replies = iter(pipe.execute() if publishers else [])
    out = {}
    for publisher, its, (posted, prechecks) in zip(publishers, counters, quotas):
        values = [next(replies) for _ in its]
        out[publisher.id] = {
            name: {"used": int(value or 0), "limit": limit, "window_start": windows[name][0]}
            for (name, limit), value in zip(publisher.caps, values)
        }
        posted_n = [next(replies) for _ in posted]
        out[publisher.id]["precheck"] = precheck_quota.usage(
            publisher.precheck, posted_n, [next(replies) for _ in prechecks], now
        )
    return out


def _mode(value: Any) -> str:
    if value not in MODES:
        raise ValidationError(CODE, "mode", "must be live or test")
    return str(value)


def _spec(raw: Any, stored: Publisher | None) -> quality.FieldSpec | None:
    """`fields`: the lead spec. A `state` enum with the values the stored spec has (one written
    before state values had to be US codes) is kept as it is, so the publisher stays editable;
    new or changed values must be US state codes."""
    kept = None if stored is None or not stored.fields_spec else quality.state_values(json.loads(stored.fields_spec))
    unchanged = kept is not None and quality.state_values(raw) == kept
    return quality.parse_spec(raw, check_states=not unchanged)


def _routing(value: Any) -> str:
    if value not in ROUTING_MODES:
        raise ValidationError(CODE, "routing", "must be one of " + ", ".join(ROUTING_MODES))
    return str(value)


class RateLimit(NamedTuple):
    """A token bucket: `burst` leads at once, refilled at `per_second`."""

    per_second: int
    burst: int


def rate_limit(value: Any) -> RateLimit | None:
    """{"per_second": 1..RATE_MAX, "burst": 1..RATE_MAX}, burst defaulting to per_second (one
    second's worth); None (absent or null): the PUBLISHER_RATE_LIMIT default applies."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationError(CODE, "rate_limit", 'must be an object {"per_second": n, "burst": n}')
    for key in value:
        if key not in ("per_second", "burst"):
            raise ValidationError(CODE, f"rate_limit.{key}", "unknown field; use per_second, burst")
    if value.get("per_second") is None:
        raise ValidationError(CODE, "rate_limit.per_second", "is required")
    per_second = v.integer(CODE, "rate_limit.per_second", value["per_second"], low=1, high=RATE_MAX)
    burst = value.get("burst")
    burst = per_second if burst is None else v.integer(CODE, "rate_limit.burst", burst, low=1, high=RATE_MAX)
    return RateLimit(per_second, burst)


def _rate_columns(limit: RateLimit | None) -> dict[str, Any]:
    return {"rate_per_second": limit.per_second if limit else None, "rate_burst": limit.burst if limit else None}


def _rate_of(row: Publisher) -> RateLimit | None:
    if not row.rate_per_second:
        return None
    assert row.rate_burst is not None  # written together with rate_per_second (_rate_columns)
    return RateLimit(row.rate_per_second, row.rate_burst)


def to_json(row: Publisher) -> dict[str, Any]:
    limit = _rate_of(row)
    return {
        "id": row.id,
        "name": row.name,
        "api_key_hint": "…" + row.api_key_hint,
        "commission_pct": f"{Decimal(row.commission_pct):.2f}",
        "payout": payout_json(
            Decimal(row.commission_pct), None if row.payout_fixed is None else Decimal(row.payout_fixed)
        ),
        "active": bool(row.active),
        "routing": row.routing,
        "rate_limit": limit._asdict() if limit else None,
        "fields": json.loads(row.fields_spec) if row.fields_spec else None,
        "caps": {
            name: getattr(row, f"cap_{name}") for name in PUBLISHER_CAPS if getattr(row, f"cap_{name}") is not None
        },
        "mode": row.mode,
        "suppress": list(suppression.stored_ids(row.suppress)),
        "precheck": precheck_quota.of_row(row).to_json(),
        "payout_hold_days": int(row.payout_hold_days),
        "sell": {"max_sales": int(row.max_sales)},
        "epl_window_days": int(row.epl_window_days),
        # what it is owed now (its payable payouts less the returns made after them), and apart
        # from it the payouts still held: docs/leads.md "Payout holds"
        "balance": f"{Decimal(row.balance):.2f}",
        "held": f"{Decimal(row.payout_held):.2f}",
        "payable": f"{Decimal(row.balance):.2f}",
        "created_at": row.created_at.isoformat() + "Z",
        "updated_at": row.updated_at.isoformat() + "Z",
    }


@dataclass(frozen=True, kw_only=True)
class PublisherRule:
    id: str
    active: bool
    payout_pct: Decimal  # the percent payout (the API's and the column's commission_pct)
    routing: str = "waterfall"
    rate_limit: RateLimit | None = None  # None: the PUBLISHER_RATE_LIMIT default
    spec: quality.FieldSpec | None = None  # the lead spec (`fields`); None: leads are not checked
    mode: str = "live"  # test: every lead of the publisher is a test lead
    payout_fixed: Decimal | None = None  # a fixed payout per sold lead; None: payout_pct of the price
    caps: tuple[tuple[str, int], ...] = ()  # (hourly | daily, leads accepted per UTC window)
    suppress: tuple[str, ...] = ()  # suppression lists a lead is refused for (before routing)
    consent: consent.Fields = consent.Fields()  # the spec's fields carrying consent evidence
    precheck: precheck_quota.Quota = precheck_quota.DEFAULT  # its pre-ping quota
    max_sales: int = 1  # `sell.max_sales`: 1, exclusive; more: shared buyers may buy it side by side
    epl_window_days: int = 7  # the days of earnings `routing: epl` ranks its buyers by

    @classmethod
    def from_row(cls, row: Publisher) -> PublisherRule:
        spec = quality.parse_spec(json.loads(row.fields_spec), check_states=False) if row.fields_spec else None
        fixed = None if row.payout_fixed is None else Decimal(row.payout_fixed)
        caps = tuple((n, int(getattr(row, f"cap_{n}"))) for n in PUBLISHER_CAPS if getattr(row, f"cap_{n}") is not None)
        return cls(
            id=row.id,
            active=bool(row.active),
            payout_pct=Decimal(row.commission_pct),
            routing=row.routing,
            rate_limit=_rate_of(row),
            spec=spec,
            mode=row.mode,
            payout_fixed=fixed,
            caps=caps,
            suppress=suppression.stored_ids(row.suppress),
            consent=spec.consent_fields() if spec else consent.Fields(),
            precheck=precheck_quota.of_row(row),
            max_sales=int(row.max_sales),
            epl_window_days=int(row.epl_window_days),
        )


WITH_CLAIM_MARGIN = 10  # tokens a bucket must have been seen to hold for a token to go with the claim


@dataclass
class Toll:
    """A lead's token: `bucket` ((per_second, burst)) when it is to be taken with the lead's
    claim (lua/claim_lead.lua), in that round trip; `owed` until the claim is sent. A request
    that ends before its claim (a bad body, a suppressed lead) takes it on its own then."""

    bucket: tuple[int, int] | None = None
    owed: bool = False

    def take(self) -> tuple[int, int] | None:
        """The bucket for the claim to take the token from (None: taken already, or no limit)."""
        self.owed = False
        return self.bucket


@dataclass
class Buckets:
    """Where a lead's token is taken. A publisher's bucket (its own rate_limit, else `default`,
    PUBLISHER_RATE_LIMIT; neither: no limit) is one Redis hash for every process
    (lua/bucket.lua). While this process last saw it hold WITH_CLAIM_MARGIN tokens or more
    (refilled since at per_second, less the tokens it has sent for since), the token goes with
    the lead's claim and costs no round trip of its own; otherwise, and for a publisher it has
    not seen yet, it is taken on its own before the body is read (`throttle`), so a publisher
    over its limit costs one round trip a request and nothing else. When other processes
    emptied the bucket meanwhile, the claim refuses the lead as `throttle` would (docs/leads.md
    "Rate limits")."""

    default: tuple[int, int] | None = None
    seen: dict[str, tuple[float, float]] = field(default_factory=dict)  # id: (tokens, monotonic time)

    def limit(self, publisher: PublisherRule) -> tuple[int, int] | None:
        return publisher.rate_limit or self.default

    def toll(self, publisher: PublisherRule) -> Toll:
        """The lead's Toll: with its claim (the last sight counted down by one), or none (the
        token taken by `throttle`, or no limit)."""
        limit = self.limit(publisher)
        seen = self.seen.get(publisher.id)
        if limit is None or seen is None:
            return Toll()
        per_second, burst = limit
        tokens, at = seen
        now = time.monotonic()
        tokens = min(burst, tokens + (now - at) * per_second)
        if tokens < WITH_CLAIM_MARGIN:
            return Toll()
        self.seen[publisher.id] = (tokens - 1, now)
        return Toll(limit, owed=True)

    def saw(self, publisher_id: str, tokens: int) -> None:
        """What Redis answered: the bucket holds `tokens` whole tokens now."""
        self.seen[publisher_id] = (tokens, time.monotonic())

    def throttle(self, store: Store, publisher: PublisherRule) -> None:
        """Take a token of the publisher's bucket in one Redis round trip. An empty bucket raises
        RateLimited and changes nothing shared but the publisher's own refusal counter."""
        limit = self.limit(publisher)
        if limit is None:
            return
        decision = store.take_token(publisher.id, *limit)
        self.saw(publisher.id, decision.tokens)
        if not decision.allowed:
            refuse(publisher.id, limit, decision.wait_ms)


def refuse(publisher_id: str, limit: tuple[int, int], wait_ms: int) -> NoReturn:
    """429 rate_limited: the publisher's bucket has no token for `wait_ms`."""
    metrics.rate_limited(publisher_id)
    per_second, burst = limit
    wait_s = max(1, math.ceil(wait_ms / 1000))
    raise RateLimited(
        f"over this publisher's rate limit ({per_second}/s, burst {burst}); retry in {wait_s} s",
        retry_after_s=wait_s,
    )


def save(publisher_id: str, fields: dict[str, Any]) -> tuple[Publisher, bool]:
    """Create or replace a publisher; an API key already used by another one is refused.
    Returns (row, fresh): fresh when it was created and the ledger has no lead of it (so
    Redis can remember every answer it is given: claims.remember_from_start)."""
    from webhooks.storage.records import audit
    from webhooks.storage.records.db import db
    from webhooks.storage.records.models import Lead, utcnow

    now = utcnow()
    with db.atomic():
        taken = (
            Publisher.select()
            .where(Publisher.api_key_hash == fields["api_key_hash"], Publisher.id != publisher_id)
            .exists()
        )
        if taken:
            raise ValidationError(CODE, "api_key", "is already used by another publisher")
        fresh = False
        if not Publisher.update(**fields, updated_at=now).where(Publisher.id == publisher_id).execute():
            Publisher.create(id=publisher_id, **fields, created_at=now, updated_at=now)
            fresh = not Lead.select().where(Lead.publisher_id == publisher_id).exists()
        detail = {k: val for k, val in fields.items() if k != "api_key_hash"}
        audit.record("admin", "publisher.put", "publisher", publisher_id, detail)
    return Publisher.get_by_id(publisher_id), fresh
