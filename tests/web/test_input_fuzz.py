"""Every admin and console input is answered 4xx, never 500 (docs/api.md "Lists, partial
updates and the operator console"): generated query strings for every list, search and
report, and generated forms for every console form, mixing hostile values (cursors of deep,
huge or duplicate-keyed JSON, instants at the calendar's edges, NUL, CR/LF, a trailing
newline, non-ASCII digits, deeply nested JSON in a JSON field) with ordinary ones, against
the app in this process on the run's Redis and database."""

from __future__ import annotations

import base64
import json
from datetime import date, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.ops import form_token, login, post_form
from testkit.payments import deliver, encode, payload, without_payer
from tests.conftest import ADMIN_TOKEN
from webhooks.web.ops import buyers as ops_buyers
from webhooks.web.ops import publishers as ops_publishers
from webhooks.web.ops.forms import JSON, NUMBER

# Derandomized: the same examples each run, so a busy machine changes nothing but the time taken.
FUZZ = settings(
    max_examples=30,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def cursor_of(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode("utf-8", "surrogatepass")).decode().rstrip("=")


def deep(n: int, opening: str = "[") -> str:
    return opening * n + "]" * n if opening == "[" else '{"a":' * n + "1" + "}" * n


EDGES = [
    "",
    " ",
    "\x00",
    "a\n",
    "a\r\nb",
    "é",
    "²",
    "--5",
    "١٢",
    "-1",
    "0",
    "1" * 40,
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-14:00",
    "0001-01-01T00:00:00",
    "9999-12-31",
    "0001-01-01",
    "2026-02-30",
    "0000-00",
    "9999-12",
    "2026-12-01T00:00:00Z\n",
    "[" * 1500,
    deep(20_000),
    deep(70, "{"),
    '{"a": 1, "a": 2}',
    "[NaN]",
    "1e999",
    "null",
    "[]",
    "{}",
    "x" * 70_000,
]
CURSOR_JSON = [
    f'["2026-11-20T12:00:00",{10**30}]',
    '["2026-11-20T12:00:00",-1]',
    '["0001-01-01T00:00:00",1]',
    '["9999-12-31T23:59:59.999999",9223372036854775807]',
    '["2026-11-20T12:00:00+14:00",1]',
    '["a"]',
    '["' + "a" * 70 + '"]',
    '[{"a":1,"a":2}]',
    "[1e999]",
    "[" * 1500,
    deep(1500),
    '"\\ud800"',
]
JSON_TEXT = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
).map(lambda value: json.dumps(value, allow_nan=True))
HOSTILE_JSON = st.one_of(
    JSON_TEXT,
    st.builds(deep, st.integers(0, 25_000), st.sampled_from("[{")),
    st.builds(lambda key, value: f'{{"{key}": {value}, "{key}": {value}}}', st.sampled_from("ak"), JSON_TEXT),
    st.builds(lambda digits: "[" + "9" * digits + "]", st.integers(300, 5000)),
)
OFFSETS = st.timedeltas(min_value=-timedelta(hours=23, minutes=59), max_value=timedelta(hours=23, minutes=59))
# Every instant Python can write, in any offset it takes: the calendar's first and last days
# (which hypothesis tries early) among them.
EDGE_DAYS = st.sampled_from([datetime.min, datetime.max, datetime(1970, 1, 1)])
EDGE_OFFSETS = st.sampled_from([timezone(timedelta(hours=14)), timezone(-timedelta(hours=14))])
INSTANTS = st.one_of(
    st.builds(lambda at, offset: at.replace(tzinfo=offset), EDGE_DAYS, EDGE_OFFSETS),
    st.datetimes(timezones=st.builds(timezone, OFFSETS.map(lambda d: timedelta(minutes=d // timedelta(minutes=1))))),
    st.datetimes(),
).map(datetime.isoformat)
DAYS = st.dates().map(date.isoformat)
MONTHS = st.dates().map(lambda d: f"{d.year:04d}-{d.month:02d}")
LEAD_KEYS = st.tuples(st.datetimes().map(datetime.isoformat), st.integers() | st.integers(2**62, 10**40))
CURSORS = st.one_of(
    st.sampled_from(CURSOR_JSON),
    LEAD_KEYS.map(lambda key: json.dumps(list(key))),
    st.lists(st.text(max_size=70), max_size=2).map(json.dumps),
    st.builds(deep, st.integers(0, 3000)),
    HOSTILE_JSON,
).map(cursor_of)
NUMBERS = st.text("0123456789-+.e²١٢ ", min_size=1, max_size=24)
VALUE = st.one_of(st.sampled_from(EDGES), st.text(max_size=24), NUMBERS)
BY_NAME = {
    "since": INSTANTS,
    "until": INSTANTS,
    "from": DAYS,
    "to": DAYS,
    "month": MONTHS,
    "cursor": CURSORS,
    "limit": NUMBERS,
    "before": NUMBERS,
}
for form_field in (*ops_buyers.NEW_FIELDS, *ops_publishers.NEW_FIELDS):
    if form_field.kind == JSON:
        BY_NAME[form_field.name] = HOSTILE_JSON
    elif form_field.kind == NUMBER:
        BY_NAME[form_field.name] = NUMBERS


def value_for(name: str) -> st.SearchStrategy[str]:
    """A value for the field `name`: of the kind it takes, at its edges, or anything at all."""
    return st.one_of(BY_NAME[name], BY_NAME[name], BY_NAME[name], VALUE) if name in BY_NAME else VALUE


ADMIN_QUERIES = {
    "/v1/admin/leads": ("publisher_id", "buyer_id", "status", "since", "until", "limit", "cursor"),
    "/v1/admin/buyers": ("limit", "cursor"),
    "/v1/admin/publishers": ("limit", "cursor"),
    "/v1/admin/events": ("endpoint_id", "type", "status", "since", "before", "limit"),
    "/v1/admin/payments": ("status", "limit"),
    "/v1/admin/payment-events": ("status", "limit"),
    "/v1/admin/webhooks/rejected": ("provider", "limit"),
    "/v1/admin/webhooks/ignored": ("provider", "since"),
    "/v1/admin/reports/leads": ("from", "to", "group_by", "format"),
    "/v1/admin/buyers/acme/statement": ("month", "format"),
    "/v1/admin/leads/l-1": ("publisher_id",),
}
CONSOLE_QUERIES = {
    "/ops/leads": ("publisher_id", "buyer_id", "status", "since", "until", "limit", "cursor"),
    "/ops/buyers": ("limit", "cursor"),
    "/ops/publishers": ("limit", "cursor"),
    "/ops/buyers/acme": ("month", "notice"),
    "/ops/buyers/acme/statement.csv": ("month",),
    "/ops/reports": ("from", "to", "group_by"),
    "/ops/reports/leads.csv": ("from", "to", "group_by"),
    "/ops/audit": ("entity",),
    "/ops/leads/l-1": ("publisher_id",),
}
CONSOLE_FORMS = {
    "/ops/buyers": tuple(f.name for f in ops_buyers.NEW_FIELDS),
    "/ops/buyers/acme": tuple(f.name for f in ops_buyers.FIELDS),
    "/ops/publishers": tuple(f.name for f in ops_publishers.NEW_FIELDS),
    "/ops/publishers/pub": tuple(f.name for f in ops_publishers.FIELDS),
    "/ops/leads/l-1/return": ("publisher_id", "reason"),
    "/ops/payments/standard/std-fuzz/assign": ("customer",),
    "/ops/events/ep/replay": ("since",),
}


def fields_of(names: tuple[str, ...]) -> st.SearchStrategy[list[tuple[str, str]]]:
    """One or two of a route's fields (the same one twice, maybe), each with a value for it:
    few, so that one refused field does not hide what another would do."""
    return st.lists(st.sampled_from(names).flatmap(lambda n: st.tuples(st.just(n), value_for(n))), max_size=2)


@pytest.fixture
def network(api, buyer_server):
    """What the routes name: a billed buyer, a publisher, an event endpoint, an unattributed
    payment; and a console session (its client and form token)."""
    billing = {"mode": "prepaid", "account": "acct-fuzz", "currency": "USD"}
    api.put_buyer("acme", buyer_server.url("acme"), billing=billing)
    api.put_publisher("pub")
    endpoint = {"url": "https://app.example/hooks", "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
    assert api.http.put(f"{api.base}/v1/admin/event-endpoints/ep", json=endpoint, headers=api.admin).ok
    raw = encode(without_payer("standard", payload("standard", "std-fuzz", 5000)))
    assert deliver(api, "standard", raw).json() == {"status": "unattributed"}
    http = api.session()
    login(http, api.base, ADMIN_TOKEN)
    return http, form_token(http, api.base)


def answered(resp) -> None:
    assert resp.status_code < 500, (resp.request.method, resp.request.url[:300], resp.status_code, resp.text[:500])


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("path", sorted(ADMIN_QUERIES))
def test_no_admin_query_is_answered_500(api, network, path, data):
    resp = api.get(path, params=data.draw(fields_of(ADMIN_QUERIES[path]), label="query"))
    answered(resp)
    if resp.status_code != 200:
        assert resp.json()["error"]["code"]  # a JSON error in docs/api.md's shape


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("path", sorted(CONSOLE_QUERIES))
def test_no_console_page_is_answered_500(api, network, path, data):
    params = data.draw(fields_of(CONSOLE_QUERIES[path]), label="query")
    answered(network[0].get(api.base + path, params=params, allow_redirects=False))


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("path", sorted(CONSOLE_FORMS))
def test_no_console_form_is_answered_500(api, network, path, data):
    http, csrf = network
    answered(post_form(http, api.base, path, data.draw(fields_of(CONSOLE_FORMS[path]), label="form"), csrf))
