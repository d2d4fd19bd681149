"""Buyers: validation of the admin body, the stored form, and the in-memory rule the lead path
filters on (active, states, blocked publishers, opening hours in the buyer's time zone)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from webhooks.billing import balance, charges
from webhooks.billing.balance import Billing
from webhooks.caps.windows import CAPS, COUNT_CAPS
from webhooks.errors import Checks, InvalidPayload, ValidationError
from webhooks.formats import money, us_states
from webhooks.formats import validate as v
from webhooks.formats.consumer import FIELDS as DEDUPE_FIELDS
from webhooks.formats.validate import cents
from webhooks.leads.posting import integration
from webhooks.leads.rules import consent, suppression
from webhooks.logs import REDACTED_URL, redact_url, restore_url
from webhooks.storage.live.scripts import NO_HOLD, Hold
from webhooks.storage.records.models import Buyer

CODE = "invalid_buyer"
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HHMM = re.compile(r"([01][0-9]|2[0-4]):([0-5][0-9])")  # fullmatch: `$` passes a trailing newline
_READ_ONLY = {"id", "usage", "breaker", "balance", "created_at", "updated_at"}
_FIELDS = {
    "name",
    "endpoint_url",
    "priority",
    "price",
    "timezone",
    "caps",
    "states",
    "blocked_publishers",
    "schedule",
    "active",
    "dedupe",
    "return_window_days",
    "returns",
    "delivery",
    "ping",
    "weight",
    "filter",
    "billing",
    "suppress",
    "require_consent",
    "contract",
}
CONTRACTS = ("exclusive", "shared")  # exclusive: offered first, buys a lead alone; shared: beside others
_BILLING_FIELDS = {"mode", "account", "currency", "credit_limit", "low_balance"}


def _zone(value: Any) -> ZoneInfo:
    try:
        if not isinstance(value, str) or not value:
            raise ValueError
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValidationError(CODE, "timezone", f"{value!r} is not an IANA time zone name") from None


def _url(value: Any, field: str = "endpoint_url", stored: str | None = None) -> str:
    """A URL field; the form GET shows of the `stored` URL, sent back unchanged, keeps it."""
    if isinstance(value, str):
        value = restore_url(value, stored)
        if value is None:
            raise ValidationError(CODE, field, REDACTED_URL)
    return v.http_url(CODE, field, value)


def _minutes(field: str, hhmm: Any) -> int:
    m = _HHMM.fullmatch(hhmm) if isinstance(hhmm, str) else None
    if not m or (m.group(1) == "24" and m.group(2) != "00"):
        raise ValidationError(CODE, field, f"{hhmm!r} is not a time HH:MM between 00:00 and 24:00")
    return int(m.group(1)) * 60 + int(m.group(2))


def _schedule(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationError(CODE, "schedule", "must be an object of days (mon..sun)")
    check = Checks()
    for day, intervals in value.items():
        check.run(None, _day, day, intervals)
    check.done()
    return value


def _day(day: str, intervals: Any) -> None:
    """One day of a `schedule`: [start, end] pairs of HH:MM, each start before its end."""
    field = f"schedule.{day}"
    if day not in DAYS:
        raise ValidationError(CODE, field, "day must be one of " + ", ".join(DAYS))
    if not isinstance(intervals, list):
        raise ValidationError(CODE, field, "must be a list of [start, end] pairs")
    for i, pair in enumerate(intervals):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValidationError(CODE, f"{field}[{i}]", "must be a [start, end] pair")
        start, end = (_minutes(f"{field}[{i}]", t) for t in pair)
        if start >= end or start == 24 * 60:
            raise ValidationError(CODE, f"{field}[{i}]", "start must be before end")


def _caps(value: Any) -> dict[str, Decimal | int]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError(CODE, "caps", "must be an object")
    caps: dict[str, Decimal | int] = {}
    for name, limit in value.items():
        field = f"caps.{name}"
        if name not in CAPS:
            raise ValidationError(CODE, field, "unknown cap; use " + ", ".join(CAPS))
        if limit is None:
            continue
        if name == "daily_budget":
            caps[name] = v.money(CODE, field, limit)
        else:
            caps[name] = v.integer(CODE, field, limit, low=0, high=2**31 - 1)
    return caps


def _dedupe(value: Any) -> dict[str, Any] | None:
    """{"fields": [email|phone, ...], "days": 1..365}, or None (no duplicate suppression)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"fields", "days"}:
        raise ValidationError(CODE, "dedupe", 'must be an object {"fields": [...], "days": n}')
    check = Checks()
    fields = check.run([], _dedupe_fields, value.get("fields"))
    days = check.run(30, v.integer, CODE, "dedupe.days", value.get("days", 30), low=1, high=365)
    check.done()
    return {"fields": fields, "days": days}


def _dedupe_fields(fields: Any) -> list[str]:
    if (
        not isinstance(fields, list)
        or not fields
        or not all(f in DEDUPE_FIELDS for f in fields)
        or len(set(fields)) != len(fields)
    ):
        raise ValidationError(CODE, "dedupe.fields", "must list one or more of " + ", ".join(DEDUPE_FIELDS))
    return fields


def _billing(value: Any, price: Decimal) -> Billing | None:
    """A buyer's `billing` (docs/api.md "Buyer balances"): prepaid, or credit with a limit, from
    the wallet `account` in `currency`; null or absent: not billed. The buyer's price must be a
    whole number of the currency's minor units (12.50 is no amount of JPY)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationError(CODE, "billing", "must be an object or null")
    unknown = sorted(set(value) - _BILLING_FIELDS)
    if unknown:
        raise ValidationError(CODE, f"billing.{unknown[0]}", "is not a billing field")
    check = Checks()
    mode = check.run(balance.PREPAID, _billing_mode, value)
    account = check.run("", v.text, CODE, "billing.account", value.get("account"), max_len=254)
    currency = check.run(None, _currency, value.get("currency"))
    if currency is None:  # its amounts cannot be read without it
        check.done()
    billing = Billing(
        mode=mode,
        account=account,
        currency=currency,
        credit_limit_minor=check.run(0, _amount, value, "credit_limit", currency) if mode == balance.CREDIT else 0,
        low_balance_minor=None
        if value.get("low_balance") is None
        else check.run(None, _amount, value, "low_balance", currency),
    )
    check.done()
    if billing.charge(price) is None:
        raise ValidationError(CODE, "price", f"must be a whole amount of {currency}'s minor unit when billed in it")
    return billing


def _billing_mode(value: dict[str, Any]) -> str:
    mode = value.get("mode")
    if mode not in (balance.PREPAID, balance.CREDIT):
        raise ValidationError(CODE, "billing.mode", "must be prepaid or credit")
    if mode == balance.PREPAID and "credit_limit" in value:
        raise ValidationError(CODE, "billing.credit_limit", "is for credit billing only")
    return str(mode)


def _currency(raw: Any) -> str:
    try:
        return money.currency(raw)
    except InvalidPayload:
        raise ValidationError(CODE, "billing.currency", "must be an ISO 4217 currency code") from None


def _amount(billing: dict[str, Any], field: str, currency: str) -> int:
    """A billing amount (decimal text, in `currency`), in minor units, not negative."""
    raw = billing.get(field)
    if not isinstance(raw, str):
        raise ValidationError(CODE, f"billing.{field}", "must be a decimal string")
    try:
        minor = money.to_minor(raw, currency, major=True)
    except InvalidPayload:
        raise ValidationError(CODE, f"billing.{field}", f"must be an amount of {currency}") from None
    if minor < 0:
        raise ValidationError(CODE, f"billing.{field}", "must not be negative")
    return minor


REVIEWS = ("auto", "manual")
_RETURNS_FIELDS = {"window_days", "max_pct", "period_days", "reasons", "review"}
MAX_REASONS = 50


@dataclass(frozen=True, kw_only=True)
class ReturnPolicy:
    """A buyer's return policy (docs/api.md "Sales"): how long after the sale, for which reasons,
    how many of its sales over a rolling period, and whether an operator reviews each return.
    The defaults are what every buyer had before policies: 7 days, any reason, no limit, auto."""

    window_days: int = 7
    max_pct: int | None = None  # returns (pending ones too) per 100 sales of the last period_days
    period_days: int = 14
    reasons: tuple[str, ...] | None = None  # None: any reason (free text)
    review: str = "auto"

    def stored(self) -> str | None:
        """The buyers.return_policy column: all but the window (its own column); None: defaults."""
        rest = self.as_json()
        del rest["window_days"]
        if rest == {"max_pct": None, "period_days": 14, "reasons": None, "review": "auto"}:
            return None
        return json.dumps(rest, sort_keys=True)

    def as_json(self) -> dict[str, Any]:
        return {
            "window_days": self.window_days,
            "max_pct": self.max_pct,
            "period_days": self.period_days,
            "reasons": None if self.reasons is None else list(self.reasons),
            "review": self.review,
        }

    @classmethod
    def of(cls, row: Buyer) -> ReturnPolicy:
        rest = json.loads(row.return_policy) if row.return_policy else {}
        reasons = rest.get("reasons")
        return cls(
            window_days=row.return_window_days,
            max_pct=rest.get("max_pct"),
            period_days=rest.get("period_days", 14),
            reasons=None if reasons is None else tuple(reasons),
            review=rest.get("review", "auto"),
        )


def _returns(raw: Any, window_days: Any) -> ReturnPolicy:
    """`returns` and the older `return_window_days` (its window when `returns` names none)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValidationError(CODE, "returns", "must be an object")
    unknown = sorted(set(raw) - _RETURNS_FIELDS)
    if unknown:
        raise ValidationError(CODE, f"returns.{unknown[0]}", "is not a field of a return policy")
    window = raw.get("window_days")
    if window is None:
        window, field = (7 if window_days is None else window_days), "return_window_days"
    else:
        field = "returns.window_days"
    max_pct = raw.get("max_pct")
    period = raw.get("period_days")
    check = Checks()
    reasons = check.run(None, _reasons, raw.get("reasons"))
    review = check.run("auto", _review, raw.get("review"))
    policy = ReturnPolicy(
        window_days=check.run(7, v.integer, CODE, field, window, low=0, high=365),
        max_pct=None
        if max_pct is None
        else check.run(None, v.integer, CODE, "returns.max_pct", max_pct, low=0, high=100),
        period_days=14
        if period is None
        else check.run(14, v.integer, CODE, "returns.period_days", period, low=1, high=365),
        reasons=reasons,
        review=review,
    )
    check.done()
    return policy


def _reasons(reasons: Any) -> tuple[str, ...] | None:
    if reasons is not None and (
        not isinstance(reasons, list)
        or not 1 <= len(reasons) <= MAX_REASONS
        or not all(v.is_id(r) for r in reasons)
        or len(set(reasons)) != len(reasons)
    ):
        raise ValidationError(
            CODE, "returns.reasons", f"must be a list of 1 to {MAX_REASONS} distinct reason codes (identifiers)"
        )
    return None if reasons is None else tuple(reasons)


def _review(review: Any) -> str:
    if review is not None and review not in REVIEWS:
        raise ValidationError(CODE, "returns.review", "must be auto or manual")
    return str(review or "auto")


def _list(field: str, value: Any, ok: Callable[[Any], object]) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(ok(x) for x in value):
        raise ValidationError(CODE, field, "must be a list of identifiers")
    return value


def parse(body: Any, stored: Buyer | None = None) -> dict[str, Any]:
    """Validate an admin PUT body; return the column values of the Buyer row. `stored` is the
    buyer as it is now, whose header secrets a redacted header sent back keeps. Every field is
    checked: a refusal is a ValidationErrors naming each bad field (the API answers the first)."""
    body = v.fields(CODE, body, _FIELDS, _READ_ONLY, ())
    check = Checks()
    check.require(CODE, body, ("name", "endpoint_url", "price"))
    stored_delivery = json.loads(stored.delivery) if stored is not None and stored.delivery else {}
    delivery = check.run(None, integration.parse_delivery, body.get("delivery"), stored_delivery.get("headers"))
    stored_ping_url = json.loads(stored.ping)["url"] if stored is not None and stored.ping else None
    ping = check.run(
        None,
        integration.parse_ping,
        body.get("ping"),
        lambda field, url: _url(url, field, stored_ping_url),
        lambda field, amount: v.money(CODE, field, amount),
    )
    caps = check.run({}, _caps, body.get("caps"))
    states = check.run([], _states, body.get("states"), None if stored is None else json.loads(stored.states))
    blocked = check.run([], _list, "blocked_publishers", body.get("blocked_publishers"), v.is_id)
    schedule = check.run(None, _schedule, body.get("schedule"))
    price = check.run(Decimal(0), v.money, CODE, "price", body.get("price"))
    billing = check.run(None, _billing, body.get("billing"), price)
    policy = check.run(ReturnPolicy(), _returns, body.get("returns"), body.get("return_window_days"))
    columns = {
        "name": check.run("", v.text, CODE, "name", body.get("name"), max_len=200),
        "endpoint_url": check.run(
            "", _url, body.get("endpoint_url"), stored=None if stored is None else stored.endpoint_url
        ),
        "priority": check.run(0, v.integer, CODE, "priority", body.get("priority", 0), low=-(10**6), high=10**6),
        "price": price,
        "timezone": check.run("UTC", lambda: _zone(body.get("timezone", "UTC")).key),
        **{f"cap_{name}": caps.get(name) for name in CAPS},
        "states": json.dumps(states),
        "blocked_publishers": json.dumps(sorted(set(blocked))),
        "schedule": None if schedule is None else json.dumps(schedule, sort_keys=True),
        "active": check.run(True, v.boolean, CODE, "active", body.get("active", True)),
        "dedupe": None if (dedupe := check.run(None, _dedupe, body.get("dedupe"))) is None else json.dumps(dedupe),
        "return_window_days": policy.window_days,
        "return_policy": policy.stored(),
        "delivery": None if delivery is None else json.dumps(delivery, sort_keys=True),
        "ping": None if ping is None else json.dumps(ping, sort_keys=True),
        "weight": check.run(1, v.integer, CODE, "weight", body.get("weight", 1), low=1, high=10**6),
        "lead_filter": check.run(None, _filter, body.get("filter")),
        "billing": None if billing is None else billing.to_json(),
        "billing_account": None if billing is None else billing.key,
        "suppress": check.run(
            None, lambda: suppression.stored_json(suppression.parse_ids(CODE, "suppress", body.get("suppress")))
        ),
        "require_consent": check.run(
            None, lambda: suppression.stored_json(consent.parse_required(CODE, body.get("require_consent")))
        ),
        "contract": check.run(CONTRACTS[0], _contract, body.get("contract")),
    }
    check.done()
    return columns


def _states(value: Any, stored: list[str] | None) -> list[str]:
    """`states`: US state and territory codes (any case), stored upper-cased, sorted, once each;
    absent, null or empty: every state. A code of no state is refused, not kept, unless the
    list is the `stored` one (written before codes were checked): sent back unchanged, as a
    patch of other fields does, it is kept, so such a buyer can still be edited."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > 2 * len(us_states.CODES):
        raise ValidationError(CODE, "states", "must be a list of US state codes such as TX")
    if stored is not None and all(isinstance(s, str) for s in value) and _codes(value) == _codes(stored):
        return _codes(value)
    unknown = [str(s)[:16] for s in value if us_states.code(s) is None]
    if unknown:
        listed = ", ".join(repr(s) for s in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise ValidationError(
            CODE, "states", f"{listed}: not a US state or territory code (two letters, e.g. TX for Texas)"
        )
    return _codes(value)


def _codes(states: list[str]) -> list[str]:
    return sorted({s.strip().upper() for s in states})


def _contract(value: Any) -> str:
    """`contract`: exclusive (the default; absent or null too) or shared."""
    if value is None:
        return CONTRACTS[0]
    if value not in CONTRACTS:
        raise ValidationError(CODE, "contract", 'must be "exclusive" or "shared"')
    return str(value)


def _filter(raw: Any) -> str | None:
    """A buyer's `filter`: a JMESPath expression compiled now (400 when it is none), run on
    the normalised lead with the static filters; None: no filter."""
    if raw is None:
        return None
    integration.compile_expression(raw, "filter")
    return str(raw)


def caps_of(row: Buyer) -> dict[str, Any]:
    caps: dict[str, Any] = {n: getattr(row, f"cap_{n}") for n in COUNT_CAPS}
    caps["daily_budget"] = None if row.cap_daily_budget is None else f"{row.cap_daily_budget:.2f}"
    return {k: val for k, val in caps.items() if val is not None}


def to_json(row: Buyer) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "endpoint_url": redact_url(row.endpoint_url),
        "priority": row.priority,
        "price": f"{Decimal(row.price):.2f}",
        "timezone": row.timezone,
        "caps": caps_of(row),
        "states": json.loads(row.states),
        "blocked_publishers": json.loads(row.blocked_publishers),
        "schedule": None if row.schedule is None else json.loads(row.schedule),
        "active": bool(row.active),
        "dedupe": json.loads(row.dedupe) if row.dedupe else None,
        "return_window_days": row.return_window_days,
        "returns": ReturnPolicy.of(row).as_json(),
        "delivery": integration.shown_delivery(json.loads(row.delivery) if row.delivery else None),
        "ping": _shown_ping(row.ping),
        "weight": row.weight,
        "filter": row.lead_filter,
        "billing": json.loads(row.billing) if row.billing else None,
        "suppress": list(suppression.stored_ids(row.suppress)),
        "require_consent": list(suppression.stored_ids(row.require_consent)),
        "contract": row.contract,
        "created_at": row.created_at.isoformat() + "Z",
        "updated_at": row.updated_at.isoformat() + "Z",
    }


@dataclass(frozen=True, kw_only=True)
class BuyerRule:
    """What the lead path needs of a buyer, parsed once per config reload."""

    id: str
    endpoint_url: str
    priority: int
    price: Decimal
    price_minor: int
    tz: ZoneInfo
    limits: tuple[tuple[str, int], ...]  # (cap, limit): counts, and daily_budget in minor units
    states: frozenset[str]
    blocked: frozenset[str]
    schedule: tuple[tuple[tuple[int, int], ...], ...] | None  # per weekday, minutes [start, end)
    dedupe_fields: tuple[str, ...] = ()  # consumer fields a duplicate is found by (none: off)
    dedupe_days: int = 0
    return_window_days: int = 7
    post: integration.PostTemplate = integration.DEFAULT_POST
    ping: integration.Ping | None = None
    weight: int = 1
    filter: Any = None  # bounded JMESPath on the normalised lead (integration.compile_expression); None: none
    billing: Billing | None = None  # pays for its leads from a wallet (billing/balance.py); None: not billed
    suppress: tuple[str, ...] = ()  # suppression lists whose consumers it is not offered
    require_consent: tuple[str, ...] = ()  # consent it is offered a lead with only when claimed
    shared: bool = False  # `contract` shared: buys a lead beside others, after every exclusive buyer

    def hold(self, price: Decimal) -> Hold | None:
        """What a reservation at `price` holds against the buyer's balance (NO_HOLD: not
        billed; None: a price its currency cannot count, never reserved)."""
        if self.billing is None:
            return NO_HOLD
        charged = self.billing.charge(price)
        return None if charged is None else self.billing.hold(charged.minor)

    def charge(self, price: Decimal) -> charges.Charged | None:
        """What a sale at `price` debits from the buyer's wallet (None: not billed)."""
        return None if self.billing is None else self.billing.charge(price)

    @classmethod
    def from_row(cls, row: Buyer) -> BuyerRule:
        caps = {n: getattr(row, f"cap_{n}") for n in CAPS}
        limits = tuple(
            (n, cents(lim) if n == "daily_budget" else int(lim)) for n, lim in caps.items() if lim is not None
        )
        schedule = None
        if row.schedule is not None:
            days = json.loads(row.schedule)
            schedule = tuple(tuple((_minutes("", a), _minutes("", b)) for a, b in days.get(d, ())) for d in DAYS)
        price = Decimal(row.price).quantize(v.CENTS)
        dedupe: dict[str, Any] = json.loads(row.dedupe) if row.dedupe else {"fields": [], "days": 0}
        return cls(
            id=row.id,
            endpoint_url=row.endpoint_url,
            priority=row.priority,
            price=price,
            price_minor=cents(price),
            tz=ZoneInfo(row.timezone),
            limits=limits,
            states=frozenset(json.loads(row.states)),
            blocked=frozenset(json.loads(row.blocked_publishers)),
            schedule=schedule,
            dedupe_fields=tuple(dedupe["fields"]),
            dedupe_days=dedupe["days"],
            return_window_days=row.return_window_days,
            post=integration.compile_post(json.loads(row.delivery) if row.delivery else None),
            ping=integration.compile_ping(json.loads(row.ping) if row.ping else None),
            weight=row.weight,
            filter=None if row.lead_filter is None else integration.load_expression(row.lead_filter),
            billing=Billing.from_json(row.billing),
            suppress=suppression.stored_ids(row.suppress),
            require_consent=suppression.stored_ids(row.require_consent),
            shared=row.contract == "shared",
        )

    def refusal(self, lead: dict[str, Any], publisher_id: str, now: datetime) -> str | None:
        """Why the static filters of phase 1 refuse this lead (a routing-trace reason), or
        None when they pass it; `now` is aware. The buyer's `filter` runs last: a falsy or
        failing result refuses (reason `filter`)."""
        if publisher_id in self.blocked:
            return "blocked_publisher"
        state = lead.get("state")
        if self.states and (not isinstance(state, str) or state.upper() not in self.states):
            return "state"
        if not self.is_open(now):
            return "closed"
        if self.filter is not None and not integration.truthy(self.filter, lead):
            return "filter"
        return None

    def is_open(self, now: datetime) -> bool:
        if self.schedule is None:
            return True
        local = now.astimezone(self.tz)
        minute = local.hour * 60 + local.minute
        return any(a <= minute < b for a, b in self.schedule[local.weekday()])


def save(buyer_id: str, fields: dict[str, Any]) -> tuple[Buyer, bool]:
    """Create or replace a buyer (and undelete it); return (row, created). Caller bumps config."""
    from webhooks.storage.records import audit
    from webhooks.storage.records.db import db
    from webhooks.storage.records.models import utcnow

    now = utcnow()
    with db.atomic():
        updated = Buyer.update(**fields, deleted_at=None, updated_at=now).where(Buyer.id == buyer_id).execute()
        created = not updated
        if created:
            Buyer.create(id=buyer_id, **fields, created_at=now, updated_at=now)
        audit.record("admin", "buyer.create" if created else "buyer.update", "buyer", buyer_id, _audited(fields))
    return Buyer.get_by_id(buyer_id), created


def set_active(buyer_ids: Sequence[str], active: bool) -> list[Buyer]:
    """Pause (or resume) the live buyers of `buyer_ids`: only `active` and `updated_at` change,
    in one UPDATE of the rows not deleted, so a buyer deleted meanwhile stays deleted and an
    edit made meanwhile is kept, and a buyer stored before a check of today is not re-checked.
    An audit row each as `save` leaves it; the buyers changed, read back in the transaction.
    Caller bumps config."""
    from webhooks.storage.records import audit
    from webhooks.storage.records.db import db
    from webhooks.storage.records.models import utcnow

    live = (Buyer.id.in_(list(buyer_ids))) & Buyer.deleted_at.is_null()
    with db.atomic():
        Buyer.update(active=active, updated_at=utcnow()).where(live).execute()
        rows = list(Buyer.select().where(live).order_by(Buyer.id))
        for row in rows:
            columns = {name: getattr(row, name) for name in Buyer._meta.sorted_field_names if name not in _NOT_AUDITED}
            audit.record("admin", "buyer.update", "buyer", row.id, _audited(columns))
    return rows


_NOT_AUDITED = frozenset({"id", "created_at", "updated_at", "deleted_at", "api_key_hash"})


def _shown_ping(stored: str | None) -> dict[str, Any] | None:
    """A stored `ping` as GET shows it: the secret query values of its URL redacted."""
    if not stored:
        return None
    ping = json.loads(stored)
    return {**ping, "url": redact_url(ping["url"])}


def _audited(fields: dict[str, Any]) -> dict[str, Any]:
    """The buyer's columns as the audit log keeps them: its credential headers and URLs only
    as GET shows them, never in clear text."""
    audited = {**fields, "endpoint_url": redact_url(fields["endpoint_url"])}
    if fields.get("ping"):
        audited["ping"] = json.dumps(_shown_ping(fields["ping"]), sort_keys=True)
    if fields.get("delivery"):
        audited["delivery"] = integration.shown_delivery(json.loads(fields["delivery"]))
    return audited


def delete(buyer_id: str) -> bool:
    """Soft-delete: the buyer gets no new leads, and its API key is gone (a buyer put back
    later needs a new one); its ledger history stays."""
    from webhooks.storage.records import audit
    from webhooks.storage.records.db import db
    from webhooks.storage.records.models import utcnow

    with db.atomic():
        n = (
            Buyer.update(deleted_at=utcnow(), active=False, api_key_hash=None)  # its key dies with it
            .where(Buyer.id == buyer_id, Buyer.deleted_at.is_null())
            .execute()
        )
        if n:
            audit.record("admin", "buyer.delete", "buyer", buyer_id)
    return bool(n)
