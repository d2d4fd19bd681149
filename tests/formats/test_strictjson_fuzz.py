"""Hostile bodies against the strict JSON parser (docs/api.md, Conventions: checking and parsing a
body is linear in its size). Generated shapes, up to the 256 KiB body limit, built by
repeating a generated unit: deep nesting, unterminated strings, escape runs, surrogate
escapes, long numbers, huge and duplicate keys, invalid UTF-8 and their mixtures. The parser
returns a value or raises InvalidJSON, agrees with a slow reference of the same rules, and the
HTTP endpoints answer a 4xx JSON error, never a 500. Timings live in bench/parse_cost.py."""

from __future__ import annotations

import json
import math
import threading
from decimal import Decimal, InvalidOperation

import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from testkit.payments import child_pids, deliver
from webhooks.errors import InvalidJSON
from webhooks.formats import strictjson

LIMIT = 256 * 1024  # the body limit (docs/api.md): the largest body any parser call ever sees
FAST = settings(max_examples=60, deadline=None, database=None)
HTTP = settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --- generated hostile bodies ---------------------------------------------------------------


@st.composite
def _repeated(draw, unit, head=st.just(b""), tail=st.just(b""), size: int = LIMIT) -> bytes:
    """head + unit * n + tail within `size`; n small, anywhere, or as large as fits."""
    h, u, t = draw(head), draw(unit), draw(tail)
    room = max(0, (size - len(h) - len(t)) // max(1, len(u)))
    n = draw(st.one_of(st.integers(0, 64), st.integers(0, room), st.just(room)))
    return h + u * n + t


ESCAPE = st.sampled_from(
    [
        b"\\\\",
        b'\\"',
        b"\\n",
        b"\\/",
        b"\\u",
        b"\\ud800",
        b"\\uDBFF",
        b"\\udc00",
        b"\\uDFFF",
        b"\\ud83d\\ude00",
        b"\\u00e9",
        b"\\",
        b'"',
        b"a",
        b"\\x",
        b"]",
        b"{",
    ]
)
ESCAPES = st.lists(ESCAPE, min_size=1, max_size=6).map(b"".join)
BAD_UTF8 = st.one_of(
    st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"]),
    st.binary(min_size=1, max_size=4),
)
DIGITS = st.text("0123456789", min_size=1, max_size=8).map(str.encode)
OPEN = st.sampled_from([b"[", b'{"a":', b"[1,", b'{"a":[', b'[{"b":'])

# A string that may never end: its escapes repeated, closed or not.
STRINGS = _repeated(
    ESCAPES,
    head=st.sampled_from([b'"', b'["', b'{"k":"', b'{"', b'[1, "x", "']),
    tail=st.sampled_from([b"", b'"', b'"]', b'"}', b'": 1}', b"\\"]),
)


@st.composite
def _nested(draw) -> bytes:
    """One opening repeated n times (often just around MAX_DEPTH), closed or not."""
    unit = draw(OPEN)
    n = draw(st.one_of(st.integers(60, 70), st.integers(0, 2000), st.integers(0, LIMIT // (2 * len(unit) + 2))))
    closes = unit.translate(None, b'"ab1:,')[::-1].translate(bytes.maketrans(b"[{", b"]}"))
    core = draw(st.sampled_from([b"", b"1", b'"x"', b"[]", b"{}"]))
    return unit * n + core + (closes * n if draw(st.booleans()) else b"")


@st.composite
def _number(draw) -> bytes:
    """A long number: a sign, a repeated digit run, a fraction, an exponent, each maybe."""

    def run():
        return draw(DIGITS) * draw(st.one_of(st.integers(0, 50), st.integers(0, LIMIT // 32)))

    text = draw(st.sampled_from([b"", b"-"])) + (run() or b"0")
    if draw(st.booleans()):
        text += b"." + (run() or b"5")
    if draw(st.booleans()):
        text += draw(st.sampled_from([b"e", b"E", b"e+", b"e-"])) + (run() or b"9")
    return draw(st.sampled_from([b"[%s]", b'{"amount": %s}', b"%s", b"[1, %s, 2]"])) % text


@st.composite
def _keys(draw) -> bytes:
    """An object with a huge key, many keys, or a key given twice."""
    key = draw(st.sampled_from([b"k", b"\\u00e9", b"\\ud83d\\ude00", b"[", b"\\\\"]))
    big = key * draw(st.integers(0, LIMIT // 32))  # given twice, still within LIMIT
    many = draw(st.integers(0, 3000))
    keys = [b'"%d"' % i for i in range(many)] + [b'"' + big + b'"']
    if draw(st.booleans()) and keys:
        keys.append(draw(st.sampled_from(keys)))
    return b"{" + b",".join(k + b":1" for k in keys) + b"}"


@st.composite
def _bad_utf8(draw) -> bytes:
    inner = draw(_repeated(st.sampled_from([b"a", b"\xc3\xa9", b"\\n"]), tail=BAD_UTF8, size=LIMIT - 64))
    return draw(st.sampled_from([b'{"name": "%s"}', b'["%s"]', b"%s"])) % inner


FRAGMENT = st.one_of(
    ESCAPES,
    OPEN,
    DIGITS,
    BAD_UTF8,
    st.sampled_from([b"]", b"}", b",", b":", b'"', b"NaN", b"-Infinity", b"1e999", b"true", b" "]),
)
MIXTURE = _repeated(
    st.lists(FRAGMENT, min_size=1, max_size=8).map(b"".join),
    head=st.sampled_from([b"", b"[", b"{", b'{"a": "', b'{"lead_id": "x", "n": ']),
    tail=st.sampled_from([b"", b"]", b"}", b'"}', b"\xff"]),
)
HOSTILE = st.one_of(_nested(), STRINGS, _number(), _keys(), _bad_utf8(), MIXTURE)


# --- a slow reference of the same rules -----------------------------------------------------


def _reference(raw: bytes, decimals: bool) -> tuple[bool, object]:
    """(accepted, value) by the rules of docs/api.md, checked the plain way: every node walked."""

    def pairs(items):
        if len({k for k, _ in items}) != len(items):
            raise InvalidJSON("duplicate")
        return dict(items)

    def constant(_name):
        raise InvalidJSON("constant")

    def integer(text):
        try:
            value = int(text)
            float(value)
        except (ValueError, OverflowError):
            raise InvalidJSON("range") from None
        return value

    def number(text):
        try:
            value = Decimal(text) if decimals else float(text)
        except InvalidOperation:
            raise InvalidJSON("range") from None
        if not math.isfinite(float(value)):
            raise InvalidJSON("range")
        return value

    try:
        value = json.loads(
            raw.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant, parse_int=integer, parse_float=number
        )
    except (UnicodeDecodeError, ValueError, RecursionError, InvalidJSON):
        return False, None
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth + 1 > strictjson.MAX_DEPTH:
                return False, None
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False, None
    return True, value


def _parse(raw: bytes, decimals: bool = False) -> tuple[bool, object]:
    """(accepted, value) by strictjson; anything but InvalidJSON escapes (a 500)."""
    try:
        return True, strictjson.loads(raw, decimals=decimals)
    except InvalidJSON:
        return False, None


# --- the parser -----------------------------------------------------------------------------


@FAST
@given(raw=HOSTILE, decimals=st.booleans())
def test_every_hostile_body_is_a_value_or_invalid_json_and_agrees_with_the_reference(raw, decimals):
    got = _parse(raw, decimals)
    assert got == _reference(raw, decimals)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**300), 10**300)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=40,
)


@FAST
@given(value=JSON_VALUES, ascii_only=st.booleans(), wrap=st.integers(0, 50))
def test_valid_json_within_the_rules_parses_as_json_loads_does(value, ascii_only, wrap):
    raw = ("[" * wrap + json.dumps(value, ensure_ascii=ascii_only) + "]" * wrap).encode()
    assert strictjson.loads(raw) == json.loads(raw)


@pytest.mark.parametrize("depth, accepted", [(63, True), (64, True), (65, False), (990, False), (5000, False)])
@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_depth_just_below_and_above_64(depth, accepted, opening):
    closing = "]" if opening == "[" else "}"
    raw = (opening * depth + '"' + "[" * 70 + '"' + closing * depth).encode()  # brackets in a string do not count
    assert _parse(raw)[0] is accepted


@pytest.mark.parametrize(
    "raw, accepted",
    [
        (rb'["\ud83d\ude00"]', True),
        (rb'["\\ud800"]', True),
        (rb'["\\\ud800"]', False),
        (rb'["\ud800"]', False),
        (rb'["\udc00"]', False),
        (rb'["\\ud800\udc00"]', False),
        (rb'["\ud800\ud800\udc00"]', False),
        (rb'["\ud800\udc00\udc00"]', False),
        (rb'["\ud800", "\udc00"]', False),
        (rb'{"\uDBFF\uDFFF": 1}', True),
        (rb'{"\udfff": 1}', False),
        (rb'["\ud800\u0041"]', False),
        (rb'["\\\\\ud83d\ude00\\"]', True),
        (rb'["\ud800\\\udc00"]', False),  # an escaped backslash between them: no pair
    ],
)
def test_escaped_surrogates_are_refused_only_when_lone(raw, accepted):
    assert _parse(raw)[0] is accepted
    assert _reference(raw, False)[0] is accepted


def test_a_decimal_exponent_past_decimals_range_is_invalid_json():
    """Decimal() raised InvalidOperation (a 500) on `1e` followed by 19 digits or more."""
    with pytest.raises(InvalidJSON):
        strictjson.loads(b'{"amount": 1e9999999999999999999}', decimals=True)


# --- the worst shapes at the body limit ---------------------------------------------------


def _fill(head: bytes, unit: bytes, tail: bytes, size: int = LIMIT) -> bytes:
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


def _lead(inner: bytes, size: int = LIMIT) -> bytes:
    """A lead object whose `notes` is `inner` repeated to fill the body."""
    head, tail = b'{"lead_id": "worst", "state": "TX", "notes": [', b"1]}"
    return _fill(head, inner + b",", tail, size)


# The quadratic shapes of the old pre-parse tokenizer (every `"` began a string match that ran to
# the end), and the costliest shapes for each later check; (body, status, error code).
WORST = {
    "quote-backslash": (_fill(b"", b'"\\', b""), 400, "invalid_json"),
    "unterminated string of escaped quotes": (_fill(b'{"lead_id": "', b'a\\"', b""), 400, "invalid_json"),
    "unterminated string of escapes": (_fill(b'{"notes": "', b"\\u00e9\\n", b""), 400, "invalid_json"),
    "deep nesting": (_fill(b"", b"[", b""), 400, "invalid_json"),
    "65 deep after 256 KiB of strings": (
        _fill(b'{"n": [' + b"[" * 64, b'"", ', b'""' + b"]" * 64 + b"]}"),
        400,
        "invalid_json",
    ),
    "lone surrogate after surrogate pairs": (
        _fill(b'{"notes": "', b"\\ud83d\\ude00", b'\\ud800"}'),
        400,
        "invalid_json",
    ),
    "duplicate key after many keys": (
        b"{" + b",".join(b'"k%d": 1' % i for i in range(20000)) + b', "k0": 2}',
        400,
        "invalid_json",
    ),
    "309-digit ints and an overflowing one": (_fill(b"[", b"9" * 308 + b",", b"9" * 309 + b"]"), 400, "invalid_json"),
    "bad UTF-8 at the end": (_fill(b'{"notes": "', b"\xc3\xa9", b'\xff"}'), 400, "invalid_json"),
    "64 deep, repeated": (_lead(b"[" * 62 + b"]" * 62), 200, None),  # with the lead and its notes: 64
    "empty objects": (_lead(b"{}"), 200, None),
    "escaped backslashes and quotes": (_fill(b'{"lead_id": "worst", "notes": "', b'\\\\\\"', b'"}'), 200, None),
    "exponent floats": (_lead(b"1.5e300"), 200, None),
}


@pytest.mark.parametrize("what", WORST)
def test_each_worst_shape_at_the_body_limit_finishes_with_the_right_answer(api, what):
    """Each of these held a worker for minutes before the parser was linear; the assertion is
    that it finishes and is answered as the rules say (bench/parse_cost.py has the timings)."""
    raw, status, code = WORST[what]
    assert len(raw) <= LIMIT
    key = api.put_publisher("surge")
    api.settle_config()
    resp = api.http.post(
        f"{api.base}/v1/leads", data=raw, headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    )
    assert resp.status_code == status, (what, resp.text[:300])
    if code is not None:
        assert resp.json()["error"]["code"] == code
    else:
        assert resp.json()["lead_id"] == "worst"


@pytest.mark.parametrize(
    "what",
    [
        "quote-backslash",
        "deep nesting",
        "65 deep after 256 KiB of strings",
        "duplicate key after many keys",
        "lone surrogate after surrogate pairs",
    ],
)
def test_each_worst_shape_in_a_signed_payment_finishes_as_a_400(api, what):
    raw = WORST[what][0]
    resp = deliver(api, "paystack", raw)  # signed: only the JSON is wrong
    assert resp.status_code == 400, (what, resp.text[:300])
    assert resp.json()["error"]["code"] in ("invalid_json", "invalid_payload")


# --- through the in-process app ---------------------------------------------------------


def _assert_a_4xx_json_error_or_an_answer(resp: requests.Response, codes: tuple[str, ...]) -> None:
    assert resp.status_code < 500, resp.text[:300]
    if resp.status_code >= 400:
        assert resp.status_code == 400, resp.text[:300]
        assert resp.json()["error"]["code"] in codes, resp.text[:300]
    else:
        assert isinstance(resp.json(), dict)


@HTTP
@given(raw=HOSTILE)
@example(raw=WORST["quote-backslash"][0])  # the shape that held a worker for minutes, always tried
def test_a_hostile_lead_body_is_a_400_never_a_500(api, raw):
    key = api.put_publisher("fuzz")
    api.settle_config()
    resp = api.http.post(
        f"{api.base}/v1/leads", data=raw, headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    )
    _assert_a_4xx_json_error_or_an_answer(resp, ("invalid_json", "invalid_lead"))


@HTTP
@given(raw=HOSTILE)
@example(raw=WORST["unterminated string of escaped quotes"][0])
def test_a_hostile_signed_payment_body_is_a_400_never_a_500(api, raw):
    resp = deliver(api, "paystack", raw)
    _assert_a_4xx_json_error_or_an_answer(resp, ("invalid_json", "invalid_payload"))


# --- the attack, under gunicorn ---------------------------------------------------------

HOSTILE_240K = [
    _fill(b"", b'"\\', b"", 240_000),
    _fill(b'{"lead_id": "', b'a\\"', b"", 240_000),
]


def test_hostile_bodies_hold_no_worker_and_a_clean_lead_of_another_publisher_is_sold(web, web_api, buyer_server):
    """The attack of issue 23: concurrent 240 KB bodies from one publisher got gunicorn to kill
    both workers (its 30 s timeout) while another publisher's clean lead waited. Now each is a
    400, no connection is aborted, the workers are the same processes, the clean lead sells."""
    api = web_api
    acme = buyer_server.add("acme")
    attacker, honest = api.put_publisher("attacker"), api.put_publisher("honest")
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    workers = sorted(child_pids(web.pid))
    answers: list[tuple[int, str]] = []
    failures: list[BaseException] = []

    def hostile(raw: bytes) -> None:
        try:
            resp = requests.post(
                f"{api.base}/v1/leads",
                data=raw,
                timeout=60,
                headers={"Authorization": f"Bearer {attacker}", "Content-Type": "application/json"},
            )
            answers.append((resp.status_code, resp.json()["error"]["code"]))
        except BaseException as exc:  # a reset connection is the failure this test is about
            failures.append(exc)

    threads = [threading.Thread(target=hostile, args=(HOSTILE_240K[i % 2],)) for i in range(6)]
    for t in threads:
        t.start()
    clean = api.post_lead(honest, {"lead_id": "clean-1", "state": "TX"})
    for t in threads:
        t.join(timeout=90)
    assert not failures, failures
    assert answers == [(400, "invalid_json")] * 6
    assert clean.status_code == 200 and clean.json()["status"] == "sold", clean.text
    assert acme.accepted == 1
    assert sorted(child_pids(web.pid)) == workers  # no worker killed by gunicorn's timeout
