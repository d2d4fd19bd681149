"""What parsing a body costs, per KiB, for the worst shapes found (issue 23 item 1): CPU time
of `webhooks.strictjson.loads` against the pre-fix implementation (copied below as
`_old_loads`, run only while one call stays inside a time budget: it is quadratic on some
shapes) and against plain `json.loads` (no strict rules: the floor), with an honest lead and a
Paystack-like payload as references. Medians of repeated calls, in µs of process CPU time per
KiB. Writes bench/out/parse_cost.{json,md}.

    python -m bench.parse_cost [--sizes 16,64,256] [--budget-s 0.5] [--min-reps 7]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import statistics
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from bench.common import machine_info, markdown_table, write_json, write_md
from testkit.payments import PAYSTACK
from webhooks import strictjson
from webhooks.errors import InvalidJSON, MalformedJSON

KIB = 1024


# ---------------------------------------------------------------------------------------------
# THE OLD IMPLEMENTATION, for comparison only: webhooks/strictjson.py as of 055e22d
# (`git show 055e22d:webhooks/strictjson.py`), renamed with an _old_ prefix. Its _check_depth
# tokenizer rescans to the end of the body from every quote of an unterminated string.
# ---------------------------------------------------------------------------------------------
_OLD_MAX_DEPTH = 64
_OLD_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)
_OLD_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _old_loads(raw: bytes, *, decimals: bool = False) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidJSON("request body is not UTF-8") from None
    _old_check_depth(text)
    try:
        value = json.loads(
            text,
            object_pairs_hook=_old_object,
            parse_constant=_old_constant,
            parse_int=_old_int,
            parse_float=_old_decimal if decimals else _old_float,
        )
    except json.JSONDecodeError as exc:
        raise MalformedJSON(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidJSON(f"JSON nested deeper than {_OLD_MAX_DEPTH} levels") from None
    if _OLD_SURROGATE_ESCAPE.search(text):
        _old_check_strings(value)
    return value


def _old_check_depth(text: str) -> None:
    depth = 0
    for match in _OLD_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > _OLD_MAX_DEPTH:
                raise InvalidJSON(f"JSON nested deeper than {_OLD_MAX_DEPTH} levels")
        elif token in "]}":
            depth -= 1


def _old_object(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise InvalidJSON(f"duplicate key {twice[:64]!r} in a JSON object")
    return obj


def _old_constant(name: str) -> Any:
    raise InvalidJSON(f"{name} is not a JSON number")


def _old_int(text: str) -> int:
    if len(text.lstrip("-")) > 309:
        raise InvalidJSON(f"number {text[:32]}... is out of range")
    value = int(text)
    if len(text) > 300:
        try:
            float(value)
        except OverflowError:
            raise InvalidJSON(f"number {text[:32]}... is out of range") from None
    return value


def _old_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidJSON(f"number {text[:32]} is out of range")
    return value


def _old_decimal(text: str) -> Decimal:
    value = Decimal(text)
    if not math.isfinite(float(value)):
        raise InvalidJSON(f"number {text[:32]} is out of range")
    return value


def _old_check_strings(value: Any) -> None:
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


# ------------------------------------------------------------ end of the old implementation


def _fill(head: bytes, unit: bytes, tail: bytes, size: int) -> bytes:
    return head + unit * max(1, (size - len(head) - len(tail)) // len(unit)) + tail


def _keys(size: int, duplicate: bool) -> bytes:
    n = size // 10
    return b"{" + b",".join(b'"k%d":1' % i for i in range(n)) + (b',"k0":2' if duplicate else b"") + b"}"


def _honest_lead(size: int) -> bytes:
    """A lead as a publisher sends one, grown by a long note and a page history."""
    lead = {
        "lead_id": "lead-000123",
        "state": "TX",
        "email": "ada.lovelace@example.com",
        "phone": "+15125550123",
        "first_name": "Ada",
        "last_name": "Lovelace",
        "zip": "78701",
        "score": 0.87,
        "consent": True,
    }
    note = "Called back on Tuesday; prefers e-mail. Intéressée par l'offre — 東京 office. "
    visit = {"page": "/quote/auto", "seconds": 12.5, "referrer": "https://search.example/?q=insurance"}
    base = len(json.dumps(lead))
    lead["notes"] = note * max(1, (size - base) // 2 // len(note.encode()))
    lead["history"] = [visit] * max(1, (size - len(json.dumps(lead).encode())) // len(json.dumps(visit)))
    return json.dumps(lead, ensure_ascii=False).encode()


def _paystack(size: int) -> bytes:
    """Paystack's documented charge.success, its metadata grown by line items."""
    body = copy.deepcopy(PAYSTACK)
    item = {"sku": "SKU-00042", "name": "Data bundle 10GB", "quantity": 1, "unit_price": 250050}
    body["data"]["metadata"] = {"order_id": "ORD-7781", "items": []}
    per = len(json.dumps(item)) + 2
    body["data"]["metadata"]["items"] = [item] * max(1, (size - len(json.dumps(body))) // per)
    return json.dumps(body).encode()


# name -> (body of `size` bytes, parse with decimals=). Each worst shape is the costliest found
# for one check (see docs/security.md "Linear parsing"); the first two are the old quadratics.
SHAPES: dict[str, tuple[Callable[[int], bytes], bool]] = {
    "honest lead (reference)": (_honest_lead, False),
    "Paystack-like payment (reference, decimals)": (_paystack, True),
    'unterminated "\\ repeated': (lambda n: _fill(b"", b'"\\', b"", n), False),
    'unterminated string of a\\" ': (lambda n: _fill(b'{"lead_id": "', b'a\\"', b"", n), False),
    "unterminated string of escapes": (lambda n: _fill(b'{"notes": "', b"\\u00e9\\n", b"", n), False),
    "[ repeated (deep nesting)": (lambda n: _fill(b"", b"[", b"", n), False),
    "64 deep, repeated (valid)": (lambda n: _fill(b"[", b"[" * 63 + b"]" * 63 + b",", b"[]]", n), False),
    "[] repeated": (lambda n: _fill(b"[", b"[],", b"[]]", n), False),
    "{} repeated": (lambda n: _fill(b"[", b"{},", b"{}]", n), False),
    "1, repeated": (lambda n: _fill(b"[", b"1,", b"1]", n), False),
    "308-digit ints": (lambda n: _fill(b"[", b"9" * 308 + b",", b"1]", n), False),
    "1e5, repeated": (lambda n: _fill(b"[", b"1e5,", b"1]", n), False),
    "1.5, repeated (decimals)": (lambda n: _fill(b"[", b"1.5,", b"1]", n), True),
    '"", repeated, 65 deep': (lambda n: _fill(b"[" * 65 + b"[", b'"",', b'""]' + b"]" * 65, n), False),
    "surrogate pairs, a lone one last": (lambda n: _fill(b'["', b"\\ud83d\\ude00", b'\\ud800"]', n), False),
    "escaped backslashes and quotes": (lambda n: _fill(b'["', b'\\\\\\"', b'"]', n), False),
    "many keys": (lambda n: _keys(n, False), False),
    "many keys, a duplicate last": (lambda n: _keys(n, True), False),
    "one huge key": (lambda n: _fill(b'{"', b"k", b'": 1}', n), False),
    "bad UTF-8 at the end": (lambda n: _fill(b'["', b"\xc3\xa9", b'\xff"]', n), False),
}


def _plain(raw: bytes, *, decimals: bool = False) -> Any:
    return json.loads(raw, parse_float=Decimal) if decimals else json.loads(raw)


def _outcome(fn: Callable, raw: bytes, decimals: bool) -> str:
    try:
        fn(raw, decimals=decimals)
        return "value"
    except MalformedJSON:
        return "MalformedJSON"
    except InvalidJSON:
        return "InvalidJSON"
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__


def cpu_us_per_kib(fn: Callable, raw: bytes, decimals: bool, min_reps: int, target_s: float) -> tuple[float, float]:
    """(median µs of process CPU per KiB, seconds of the first call): at least `min_reps`
    calls, more while they add up to less than `target_s`."""
    samples = []
    while len(samples) < min_reps or sum(samples) < target_s:
        start = time.process_time()
        try:
            fn(raw, decimals=decimals)
        except (InvalidJSON, ValueError, RecursionError):  # a refusal costs what it costs
            pass
        samples.append(time.process_time() - start)
        if len(samples) >= 200:
            break
    return statistics.median(samples) * 1e6 / (len(raw) / KIB), samples[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16,64,256", help="body sizes in KiB")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=0.5,
        help="the old implementation runs at a size only while one call stayed under this",
    )
    parser.add_argument("--min-reps", type=int, default=7)
    parser.add_argument("--target-s", type=float, default=0.3, help="run calls until they add up to this")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.time()
    rows, data = [], []
    for name, (build, decimals) in SHAPES.items():
        old_over = None
        for kib in sizes:
            raw = build(kib * KIB)
            new, _ = cpu_us_per_kib(strictjson.loads, raw, decimals, args.min_reps, args.target_s)
            plain, _ = cpu_us_per_kib(_plain, raw, decimals, args.min_reps, args.target_s)
            old = None
            if old_over is None:
                old, first_s = cpu_us_per_kib(_old_loads, raw, decimals, 3 if kib > sizes[0] else 1, 0)
                if first_s > args.budget_s:
                    old_over = f"over budget ({first_s:.1f} s at {kib} KiB)"
            entry = {
                "shape": name,
                "kib": kib,
                "outcome": _outcome(strictjson.loads, raw, decimals),
                "old_outcome": _outcome(_old_loads, raw, decimals) if old is not None and kib == sizes[0] else None,
                "new_us_per_kib": round(new, 2),
                "old_us_per_kib": None if old is None else round(old, 1),
                "plain_us_per_kib": round(plain, 2),
                "new_ms_per_body": round(new * kib / 1000, 3),
            }
            data.append(entry)
            rows.append(
                {
                    **entry,
                    "old": f"{old:,.1f}" if old is not None else (old_over or "—"),
                    "ratio": f"{new / plain:.1f}" if plain else "—",
                }
            )
            print(
                f"{name:45s} {kib:4d} KiB  new {new:9.2f}  old {rows[-1]['old']:>28s}  plain {plain:8.2f}"
                f"  µs/KiB  -> {entry['outcome']}",
                flush=True,
            )
    info = machine_info()
    write_json(
        "parse_cost.json",
        {"machine": info, "sizes_kib": sizes, "results": data, "took_s": round(time.time() - started, 1)},
    )
    table = markdown_table(
        rows,
        (
            ("shape", "shape"),
            ("KiB", "kib"),
            ("answer", "outcome"),
            ("new µs/KiB", "new_us_per_kib"),
            ("new ms per body", "new_ms_per_body"),
            ("old µs/KiB", "old"),
            ("json.loads µs/KiB", "plain_us_per_kib"),
            ("new / json.loads", "ratio"),
        ),
    )
    worst = max((r for r in data if r["kib"] == max(sizes)), key=lambda r: r["new_us_per_kib"])
    md = (
        f"{info['date']} · {info['nproc']} CPUs ({info['cpu_model']}) · Python {info['python']} · load "
        f"average {info['loadavg_1m_5m_15m']} at the end · run took {time.time() - started:.0f} s.\n\n"
        f"{table}\n\nCostliest shape at {max(sizes)} KiB for the new parser: {worst['shape']}, "
        f"{worst['new_us_per_kib']} µs/KiB ({worst['new_ms_per_body']} ms per body).\n"
    )
    print(write_md("parse_cost.md", md))
    print(md)


if __name__ == "__main__":
    main()
