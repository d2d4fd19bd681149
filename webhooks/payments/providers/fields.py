"""Reading a provider's JSON body by path: the small helpers notifications.py and motions.py share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhooks.errors import InvalidPayload, MalformedJSON
from webhooks.formats import strictjson

Path = tuple[str, ...]


def get(body: Any, path: Path) -> Any:
    for part in path:
        if not isinstance(body, dict):
            return None
        body = body.get(part)
    return body


def equals(path: Path, value: str) -> Callable[[dict[str, Any]], bool]:
    return lambda body: get(body, path) == value


def both(*checks: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    return lambda body: all(check(body) for check in checks)


def one_of(path: Path, values: frozenset[str]) -> Callable[[dict[str, Any]], bool]:
    return lambda body: get(body, path) in values


def reference(value: Any) -> str | None:
    """A reference or id: 1 to 128 printable characters (a whole number as its digits)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and 0 < len(value) <= 128 and value.isprintable():
        return value
    return None


def email(value: Any) -> str:
    address = value.strip().lower() if isinstance(value, str) else ""
    if not 3 <= len(address) <= 254 or "@" not in address or not address.isprintable() or " " in address:
        raise InvalidPayload(f"payer e-mail {value!r} is missing or invalid")
    return address


def load(raw: bytes) -> dict[str, Any]:
    """The body, amounts as Decimal. Not JSON at all: invalid_payload (docs/api.md's "body not
    parseable"); JSON the strict rules refuse (NaN, duplicate keys, ...): InvalidJSON."""
    try:
        body = strictjson.loads(raw, decimals=True)
    except MalformedJSON:
        raise InvalidPayload("body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidPayload("body is not a JSON object")
    return body
