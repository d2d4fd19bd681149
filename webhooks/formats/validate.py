"""Small field validators shared by the admin, lead and payment bodies."""

from __future__ import annotations

import re
import unicodedata
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlparse

from webhooks import outbound
from webhooks.errors import ValidationError

ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")  # always fullmatch: `$` would pass "id\n"
CENTS = Decimal("0.01")
DECIMAL_STRING = re.compile(r"[0-9]+(?:\.[0-9]{1,2})?")  # ASCII digits; [0-9], not \d (any script)
_DECIMAL_PLACES = re.compile(r"[0-9]+\.([0-9]+)")


def is_id(value: Any) -> bool:
    return isinstance(value, str) and ID_RE.fullmatch(value) is not None


def bearer(authorization: str) -> str:
    """The credentials of an `Authorization: Bearer <token>` header, "" when it has none. The
    scheme name is case-insensitive (RFC 9110, 11.1): `bearer x` and `BEARER x` count."""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def fields(code: str, body: Any, known: set[str], read_only: set[str], required: tuple[str, ...]) -> dict[str, Any]:
    """Check the shape of an admin PUT body: an object, no unknown field (a typo must not
    silently mean a default), every required field present. Read-only fields (what a GET
    adds) are allowed so that a fetched resource can be put back."""
    if not isinstance(body, dict):
        raise ValidationError(code, "body", "must be a JSON object")
    for key in body:
        if key not in known and key not in read_only:
            raise ValidationError(code, key, "unknown field")
    for name in required:
        if name not in body:
            raise ValidationError(code, name, "is required")
    return body


def money(code: str, field: str, value: Any, *, max_value: Decimal = Decimal("9999999999")) -> Decimal:
    """A non-negative decimal with at most two places, from a string (or a JSON number).

    The text must be ASCII digits with an optional fraction (docs/api.md, Conventions): Decimal()
    alone would also take "1_0.00", "１２.50" or "١٢", " 12 " and "1e2"."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValidationError(code, field, 'must be a decimal string such as "12.50"')
    text = value if isinstance(value, str) else str(value)
    if not DECIMAL_STRING.fullmatch(text):
        if (m := _DECIMAL_PLACES.fullmatch(text)) and len(m.group(1)) > 2:
            raise ValidationError(code, field, "must have at most two decimal places")
        raise ValidationError(code, field, f'{value!r} is not a decimal string of ASCII digits such as "12.50"')
    try:
        amount = Decimal(text)
    except InvalidOperation:  # not reachable after the pattern; kept so no input can raise
        raise ValidationError(code, field, f"{value!r} is not a decimal number") from None
    if amount > max_value:
        raise ValidationError(code, field, f"must be between 0 and {max_value}")
    return amount.quantize(CENTS)


def integer(code: str, field: str, value: Any, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(code, field, "must be an integer")
    if not low <= value <= high:
        raise ValidationError(code, field, f"must be between {low} and {high}")
    return value


def text(code: str, field: str, value: Any, *, max_len: int, min_len: int = 1) -> str:
    if not isinstance(value, str) or not min_len <= len(value) <= max_len:
        raise ValidationError(code, field, f"must be a string of {min_len} to {max_len} characters")
    return value


def boolean(code: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(code, field, "must be true or false")
    return value


MAX_INSTANT = 40  # characters: "2026-12-01T00:00:00.123456+05:30" is 32


def instant(code: str, field: str, raw: object, *, problem: str, offset_required: bool) -> datetime:
    """An ISO 8601 instant as an aware UTC datetime: `problem` (400 `code` naming `field`) for
    anything else, for a time without an offset when `offset_required` (else it is UTC), and
    for one that is outside the years 1 to 9999 once in UTC (0001-01-01T00:00:00+14:00 is in
    year 0), which neither Python nor the database can hold."""
    if not isinstance(raw, str) or not raw.isascii() or len(raw) > MAX_INSTANT:
        raise ValidationError(code, field, problem)
    try:
        at = datetime.fromisoformat(raw)
        if at.tzinfo is None and not offset_required:
            at = at.replace(tzinfo=timezone.utc)
        if at.tzinfo is None:
            raise ValueError(raw)
        return at.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        raise ValidationError(code, field, problem) from None


def since(raw: object, code: str) -> datetime:
    """A `since` time, ISO 8601 (UTC when it names no offset), as naive UTC (the ledger's)."""
    problem = 'must be an ISO 8601 time such as "2026-12-01T00:00:00Z"'
    return instant(code, "since", raw, problem=problem, offset_required=False).replace(tzinfo=None)


DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")  # fullmatch: `$` would pass a trailing newline


def day(code: str, field: str, raw: str) -> date:
    """A date, YYYY-MM-DD (400 `code` naming `field` otherwise)."""
    try:
        if not DAY.fullmatch(raw):
            raise ValueError
        return date.fromisoformat(raw)
    except ValueError:
        raise ValidationError(code, field, "must be a date, YYYY-MM-DD (UTC)") from None


def merge_patch(target: object, patch: object) -> object:
    """RFC 7396 JSON merge patch: `patch`'s members replace `target`'s, recursively for
    objects; a null member removes one; anything but an object replaces the whole."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def cents(amount: Decimal | str) -> int:
    """A price or budget in cents (the unit cap counters count `daily_budget` in)."""
    return int(Decimal(amount) * 100)


def http_url(code: str, field: str, value: Any) -> str:
    """An absolute http(s) URL without userinfo (credentials in a URL end up in logs and
    proxies: send them as headers) and without control characters or spaces, which URL
    parsers read differently (a request smuggled into another host or path)."""
    url = text(code, field, value, max_len=2048)
    if any(c.isspace() or unicodedata.category(c) == "Cc" for c in url):
        raise ValidationError(code, field, "must not contain spaces or control characters")
    parts = urlparse(url)
    if "@" in parts.netloc:
        raise ValidationError(code, field, "must not carry a user name or password (user:pass@)")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError(code, field, "must be an absolute http(s) URL")
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise ValidationError(code, field, "has an invalid port") from None
    refusal = outbound.deny_list().refusal(url)  # checked again on every address it resolves to
    if refusal:
        raise ValidationError(code, field, refusal)
    return url
