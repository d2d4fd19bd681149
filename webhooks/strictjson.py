"""The one JSON parser for request bodies (the admin and lead APIs, payment webhooks, provider
replies): strict where Python's json module is lenient.

API.md, Conventions: a body must be UTF-8; `NaN`, `Infinity` and numbers that overflow a
double (`1e999`) are refused, as are duplicate keys (two parsers may keep different ones) and
nesting deeper than MAX_DEPTH (the json module recurses in C: a deep body is a RecursionError,
or worse, not a clean 400). Plain syntax errors raise MalformedJSON, the strict rules
InvalidJSON (its base class), so a caller can tell "not JSON at all" from "JSON we refuse".
"""
from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

from webhooks.errors import InvalidJSON, MalformedJSON

MAX_DEPTH = 64
# A string (skipped whole, so brackets inside it do not count) or a bracket.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def loads(raw: bytes, *, decimals: bool = False) -> Any:
    """`raw` as JSON; numbers with a fraction or exponent are floats, or Decimals with
    `decimals` (money from providers). Raises InvalidJSON (400 invalid_json)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidJSON("request body is not UTF-8") from None
    _check_depth(text)
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_constant=_constant, parse_int=_int,
                           parse_float=_decimal if decimals else _float)
    except json.JSONDecodeError as exc:
        raise MalformedJSON(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # not reachable past _check_depth; kept as the last line of defence
        raise InvalidJSON(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if _SURROGATE_ESCAPE.search(text):
        _check_strings(value)
    return value


def _check_depth(text: str) -> None:
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise InvalidJSON(f"JSON nested deeper than {MAX_DEPTH} levels")
        elif token in "]}":
            depth -= 1


def _object(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise InvalidJSON(f"duplicate key {twice[:64]!r} in a JSON object")
    return obj


def _constant(name: str) -> Any:
    raise InvalidJSON(f"{name} is not a JSON number")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 309:  # past a double's range (and int()'s 4300-digit limit)
        raise InvalidJSON(f"number {text[:32]}... is out of range")
    value = int(text)
    if len(text) > 300:
        try:
            float(value)
        except OverflowError:
            raise InvalidJSON(f"number {text[:32]}... is out of range") from None
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidJSON(f"number {text[:32]} is out of range")
    return value


def _decimal(text: str) -> Decimal:
    value = Decimal(text)
    if not math.isfinite(float(value)):
        raise InvalidJSON(f"number {text[:32]} is out of range")
    return value


def _check_strings(value: Any) -> None:
    """An escaped lone surrogate (`"\\ud800"`) is valid JSON syntax but no UTF-8 text: refuse
    it here rather than fail later when the string is stored or sent on."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidJSON("JSON string is not UTF-8 text (a lone surrogate)") from None
