"""The one JSON parser for request bodies and provider replies, strict where Python's json module
is lenient: UTF-8 only, no `NaN`, `Infinity`, number that overflows a double, duplicate key,
lone surrogate or nesting past MAX_DEPTH; and linear in the body size for every input.
MalformedJSON: not JSON at all; InvalidJSON (its base class): JSON we refuse. Why and how:
docs/security.md "Linear parsing"."""

from __future__ import annotations

import gc
import json
import math
import re
from array import array
from collections import Counter
from decimal import Decimal, InvalidOperation
from itertools import accumulate
from operator import itemgetter
from typing import Any

from webhooks.errors import InvalidJSON, MalformedJSON

MAX_DEPTH = 64
# A number needs a Python hook only if it may be out of a double's range: 309 digits in a row
# (10**308 is the first with 309) or an exponent (a digit, then e or E). The translated body
# says whether any such shape occurs anywhere, strings included (then the hooks run anyway).
_NUMBER_SHAPE = bytes(0x30 if 0x30 <= b <= 0x39 else 0x65 if b in b"eE" else 0x20 for b in range(256))
_LONG_RUN = b"0" * 309
_EXPONENT = b"0e"
# Brackets and quotes are all the depth check keeps; then opening brackets become +1 and
# closing ones -1 (as signed bytes).
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# A high surrogate escape not followed by a low one, or a low one not preceded by a high one;
# only meaningful once every escaped backslash (`\\`) is gone, so that each `\` left starts
# an escape.
_LONE_SURROGATE = re.compile(
    rb"\\u[dD](?:[89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    rb"|[c-fC-F](?<!\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F]))"
)


def loads(raw: bytes, *, decimals: bool = False) -> Any:
    """`raw` as JSON; numbers with a fraction or exponent are floats, or Decimals with
    `decimals` (money from providers). Raises InvalidJSON (400 invalid_json)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidJSON("request body is not UTF-8") from None
    collecting = gc.isenabled()
    gc.disable()  # a JSON value holds no cycle; collecting while it is built only costs (bench/)
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_constant=_constant, **_number_hooks(raw, decimals))
    except json.JSONDecodeError as exc:
        raise MalformedJSON(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # nested past the recursion limit (~1000): far past MAX_DEPTH
        raise InvalidJSON(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    finally:
        if collecting:
            gc.enable()
    _check_depth(raw)
    _check_surrogates(raw)
    return value


def _number_hooks(raw: bytes, decimals: bool) -> dict[str, Any]:
    """The json.loads number arguments: the C defaults (Decimal itself with `decimals`) unless
    a number might overflow a double (or, for ints, pass int()'s 4300-digit limit); then the
    hooks that refuse it, a Python call per number."""
    shapes = raw.translate(_NUMBER_SHAPE)
    long_run, exponent = _LONG_RUN in shapes, _EXPONENT in shapes
    hooks: dict[str, Any] = {"parse_int": _int} if long_run else {}
    if long_run or exponent:
        hooks["parse_float"] = _decimal if decimals else _float
    elif decimals:
        hooks["parse_float"] = Decimal
    return hooks


def _check_depth(raw: bytes) -> None:
    """Refuse nesting deeper than MAX_DEPTH. `raw` is valid JSON (json.loads took it): with the
    escaped backslashes and then the escaped quotes gone, every quote left opens or closes a
    string, so the brackets outside strings are the even pieces between quotes."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    quoted = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    steps = b"".join(quoted.split(b'"')[::2]).translate(_STEPS)
    if max(accumulate(array("b", steps)), default=0) > MAX_DEPTH:
        raise InvalidJSON(f"JSON nested deeper than {MAX_DEPTH} levels")


def _check_surrogates(raw: bytes) -> None:
    """An escaped lone surrogate (`"\\ud800"`) is valid JSON syntax but no UTF-8 text: refuse
    it here rather than fail later when the string is stored or sent on. `raw` is valid JSON:
    outside strings there is no backslash, inside each `\\` starts an escape, so dropping the
    escaped backslashes (left to right, as the parser reads them) leaves only real escapes.
    They become two plain bytes, not nothing: a high escape, an escaped backslash and a low
    escape are no pair, and must not be made to look like one."""
    if _SURROGATE_ESCAPE.search(raw) and _LONE_SURROGATE.search(raw.replace(b"\\\\", b"..")):
        raise InvalidJSON("JSON string is not UTF-8 text (a lone surrogate)")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        counts = Counter(map(itemgetter(0), pairs))
        twice = max(counts, key=counts.__getitem__)  # a key seen more than once, found in C
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
    try:
        value = Decimal(text)
    except InvalidOperation:  # an exponent past Decimal's own range (19 digits or more)
        raise InvalidJSON(f"number {text[:32]} is out of range") from None
    if not math.isfinite(float(value)):
        raise InvalidJSON(f"number {text[:32]} is out of range")
    return value
