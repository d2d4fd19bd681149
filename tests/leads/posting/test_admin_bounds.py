"""Admin input is bounded too (docs/api.md "Nothing outside can stall or exhaust Floodgate"): a
buyer's `filter`, `accept` and `ping.bid` JMESPath, its `accept_regex` and its templates cost
bounded work and memory per lead, whatever the admin writes. Each hostile input is refused at
PUT or fails only its own lead's offer or delivery, against real HTTP buyers and Redis; the
bounds are shown by counting (the evaluator's steps and units, tracemalloc's peak), with a
wall clock only as a far-off safety net."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tracemalloc

import jmespath
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from webhooks.errors import ValidationError
from webhooks.leads.posting import bounded, integration

MB = 1024 * 1024
# The issue's filter: 26 stages, each doubling the value the next one walks.
ISSUE_FILTER = "[@,@]|" * 25 + "[@,@]"
# Within every static bound (5 pipes, 5 multiselects), and 8 ** 5 = 32,768 copies of the
# lead once written out: what today's evaluator would build for to_string, per lead.
EXPLODING = "[@,@,@,@,@,@,@,@]|" * 5 + "length(to_string(@)) > `0`"


def _put(api, buyer_id: str, url: str, **fields):
    body = {"name": buyer_id, "endpoint_url": url, "priority": 1, "price": "1.00", "timezone": "UTC", **fields}
    return api.http.put(f"{api.base}/v1/admin/buyers/{buyer_id}", headers=api.admin, json=body)


def _reply(buyer, body, status=200, ctype="application/json"):
    buyer.mode = "reply"
    buyer.reply = (status, body if isinstance(body, bytes) else json.dumps(body).encode(), ctype)


# --- JMESPath --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        ISSUE_FILTER,  # 25 pipes, 26 multiselects
        "abs(" * 30 + "a" + ")" * 30,  # nested deeper than MAX_DEPTH
        "a" + "[*]" * 9,  # 9 projections
        "a" + "[]" * 9,  # 9 flattens
        "x" * 1025,
    ],
)
@pytest.mark.parametrize("where", ["filter", "delivery.accept", "ping.bid"])
def test_jmespath_past_its_static_bounds_is_refused_at_put_naming_the_field(api, buyer_server, where, expression):
    url = buyer_server.url("b")
    fields = {
        "filter": {"filter": expression},
        "delivery.accept": {"delivery": {"accept": expression}},
        "ping.bid": {"ping": {"url": url + "/ping", "bid": expression}},
    }[where]
    resp = _put(api, "b", url, **fields)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_buyer" and error["message"].startswith(where + ":"), error
    assert api.get("/v1/admin/buyers/b").status_code == 404


def test_a_filter_over_its_budget_on_a_lead_skips_that_buyer_only(api, buyer_server):
    fancy, plain = buyer_server.add("fancy"), buyer_server.add("plain")
    key = api.put_publisher("surge")
    assert _put(api, "fancy", buyer_server.url("fancy"), filter=EXPLODING).status_code == 200
    assert _put(api, "plain", buyer_server.url("plain"), priority=2).status_code == 200
    api.settle_config()
    tracemalloc.start()
    try:
        body = api.post_lead(key, {"lead_id": "big", "note": "n" * 4096}).json()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert body["status"] == "sold" and body["buyer_id"] == "plain", body
    assert not fancy.received and len(plain.received) == 1
    assert peak < 32 * MB, peak  # unbounded: 8 ** 5 copies of a 4 KiB lead written out, 128 MiB
    # the same rule on a lead it can judge within budget: still a filter that passes
    assert _put(api, "fancy", buyer_server.url("fancy"), filter="length(to_string(@)) > `0`").status_code == 200
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "small", "note": "n"}).json()["buyer_id"] == "fancy"


def test_an_accept_rule_over_its_budget_fails_that_delivery_as_an_error(api, buyer_server):
    fancy, plain = buyer_server.add("fancy"), buyer_server.add("plain")
    _reply(fancy, {"accepted": True, "pad": "p" * 4096})
    key = api.put_publisher("surge")
    assert _put(api, "fancy", buyer_server.url("fancy"), delivery={"accept": EXPLODING}).status_code == 200
    assert _put(api, "plain", buyer_server.url("plain"), priority=2).status_code == 200
    api.settle_config()
    body = api.post_lead(key, {"lead_id": "a1"}).json()
    assert [(a["buyer_id"], a["outcome"]) for a in body["attempts"]] == [("fancy", "error"), ("plain", "accepted")]
    assert body["buyer_id"] == "plain" and len(fancy.received) == 1 and len(plain.received) == 1


def test_a_bid_rule_over_its_budget_means_no_bid(api, buyer_server):
    fancy, ping = buyer_server.add("fancy"), buyer_server.add("fancy/ping")
    plain = buyer_server.add("plain")
    _reply(ping, {"price": "9.00", "pad": "p" * 4096})
    key = api.put_publisher("surge")
    bid = "[@,@,@,@,@,@,@,@]|" * 5 + "length(to_string(@)) > `0` && [0][0][0][0][0].price"
    ping_rule = {"url": buyer_server.url("fancy/ping"), "bid": bid, "min_bid": "1.00"}
    assert _put(api, "fancy", buyer_server.url("fancy"), ping=ping_rule).status_code == 200
    assert _put(api, "plain", buyer_server.url("plain"), priority=2).status_code == 200
    api.settle_config()
    body = api.post_lead(key, {"lead_id": "p1"}).json()
    assert body["buyer_id"] == "plain" and len(ping.received) == 1 and not fancy.received, body
    assert len(plain.received) == 1


def _evaluate(source: str, data) -> tuple[object, bounded._Interpreter]:
    interpreter = bounded._Interpreter()
    try:
        return interpreter.visit(jmespath.compile(source).parsed, data), interpreter
    except bounded.ExpressionBudgetExceeded as exc:
        return exc, interpreter


def test_evaluation_stops_at_its_step_and_unit_bounds():
    lead = {"l": list(range(3000)), "s": "x" * 1000}
    value, run = _evaluate("l[*].[@, @, @]", lead)  # 4 steps an element: past MAX_STEPS
    assert isinstance(value, bounded.ExpressionBudgetExceeded) and run.steps == bounded.MAX_STEPS + 1
    value, run = _evaluate(ISSUE_FILTER + "|to_string(@)", lead)  # 2 ** 26 leads once written out
    assert isinstance(value, bounded.ExpressionBudgetExceeded) and run.units <= 4 * bounded.MAX_UNITS
    assert run.steps < 100  # stopped early: the size of a shared value is known without copying it
    value, run = _evaluate("join(s, [s, s, s, s, s, s, s, s][] | [@, @, @, @, @, @, @, @][])", lead)
    assert isinstance(value, str) and len(value) < bounded.MAX_UNITS  # 64 * 1000 + 63 * 1000
    tracemalloc.start()
    try:
        value, run = _evaluate("join(s, w)", {"s": "x" * 2000, "w": ["a"] * 20_000})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(value, bounded.ExpressionBudgetExceeded) and run.units < 100_000  # a cheap call...
    assert peak < 8 * MB, peak  # ...refused before it joins 20,000 x 2,000 characters of separator


# A small JMESPath grammar whose combinations include every explosive shape: multiselects of
# the current value, projections, flattens, pipes and the functions that walk or copy.
_ATOMS = st.sampled_from(["@", "l", "s", "d", "`1`", "'x'", "d.*", "l[*]", "l[]", "l[?@ > `1`]"])


def _grow(inner):
    return st.one_of(
        st.builds(lambda a, b: f"[{a},{b}]", inner, inner),
        st.builds(lambda a, b: f"{{a: {a}, b: {b}}}", inner, inner),
        st.builds(lambda a, b: f"{a} | {b}", inner, inner),
        st.builds(lambda a: f"({a})[]", inner),
        st.builds(lambda a, f: f"{f}({a})", inner, st.sampled_from(["to_string", "length", "sort", "values"])),
        st.builds(lambda a, b: f"{a} == {b}", inner, inner),
        st.builds(lambda a: f"join(s, to_array({a})[])", inner),
    )


EXPRESSIONS = st.recursive(_ATOMS, _grow, max_leaves=40)
HOSTILE_DATA = {"l": list(range(200)), "s": "y" * 2000, "d": {f"k{i}": "v" * 100 for i in range(100)}}


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(EXPRESSIONS)
def test_any_expression_saved_runs_within_its_bounds(source):
    try:
        expression = bounded.compile_jmespath(source)
    except bounded.ExpressionRefused:
        return
    interpreter = bounded._Interpreter()
    tracemalloc.start()
    try:
        interpreter.visit(expression.parsed, HOSTILE_DATA)
    except (bounded.ExpressionBudgetExceeded, jmespath.exceptions.JMESPathError, TypeError):
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert interpreter.steps <= bounded.MAX_STEPS + 1
    assert peak < 64 * MB, (source, peak)


# --- accept_regex ----------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=ACCEPTED)", r"(?<!NOT )ACCEPTED", r"(?P<s>x)(?P=s)", "x" * 1025])
def test_accept_regex_that_re2_cannot_run_is_refused_at_put(api, buyer_server, pattern):
    resp = _put(api, "b", buyer_server.url("b"), delivery={"accept_regex": pattern})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"].startswith("delivery.accept_regex:"), resp.text


def test_accept_regex_keeps_search_semantics_and_is_linear_on_a_hostile_reply():
    """`^(a+)+$` on 64 KiB of "a" and a "b": a backtracking engine tries 2 ** 65536 ways (the
    issue: 1.3 s on a short reply); RE2 answers at once. Run in a child so that a regression
    fails at the guard (60 s, thousands of times what RE2 needs) instead of hanging."""
    code = textwrap.dedent(
        """
        from webhooks.leads.posting import integration
        d = integration.compile_post(integration.parse_delivery({"accept_regex": "^(a+)+$"}))
        assert d.accepted(b"a" * 65535 + b"b") is False
        assert d.accepted(b"aaaa") is True
        d = integration.compile_post(integration.parse_delivery({"accept_regex": "<s>OK</s>"}))
        assert d.accepted(b"<r><s>OK</s></r>") is True and d.accepted(b"<s>NO</s>") is False
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=".")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# --- templates -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x'.center(400000000) }}",  # the issue's: 400 MB made before the budget saw it
        "{{ lead.email.ljust(200000000) }}",
        "{{ 'x'.zfill(200000000) }}",
        "{{ '{:>200000000}'.format('x') }}",
        "{{ ('\t' * 100).expandtabs(2000000) }}",
        "{{ ('a' * 1000).replace('a', 'b' * 200000) }}",
        "{{ ('x' * 2000).join(['a'] * 100000) }}",
        "{{ ('%s' * 1000) % (('y' * 200000,) * 1000) }}",
        "{{ [1, 2]|tojson(indent=100000000) }}",
        "{{ (1).to_bytes(100000000, 'big') }}",
        "{{ 'x'.encode().center(100000000) }}",
    ],
)
def test_template_string_methods_are_refused_at_put_before_they_allocate(template):
    tracemalloc.start()
    try:
        with pytest.raises(ValidationError) as refused:
            integration.parse_delivery({"fields": {"x": template}})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.field == "delivery.fields.x" or "delivery.fields.x" in str(refused.value)
    assert peak < 16 * MB, peak


def test_a_sum_of_lists_is_refused_before_it_runs():
    """Python's sum of lists copies quadratically inside one C call: 7.6 s of it ran before the
    25 ms time budget could look. Refused for what it is, not for the time it took."""
    with pytest.raises(ValidationError, match="sum adds numbers only"):
        integration.parse_delivery({"fields": {"x": "{{ ([[1] * 1000] * 1000)|sum(start=[]) }}"}})


@pytest.mark.parametrize(
    "template",
    [
        "{{ (lead.s|default('x')).center(lead.n|default('1')|int) }}",
        "{{ " + " ~ ".join(["lead.s"] * 300) + " }}",  # 300 copies of a long field
        "{{ [" + ", ".join(["lead.s"] * 200) + "]|join }}",
        "{{ " + " + ".join(["lead.s|string"] * 90) + " }}",
    ],
)
def test_a_template_a_lead_makes_large_fails_that_delivery_without_allocating(template):
    delivery = integration.compile_post(integration.parse_delivery({"fields": {"x": template}}))
    context = {**integration.SAMPLE, "lead": {"s": "s" * 200_000, "n": "300000000"}}
    tracemalloc.start()
    try:
        with pytest.raises(integration.RenderBudgetExceeded):
            delivery.body(context, b"")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * MB, peak  # unbounded: 300 MB, 60 MB, 40 MB


def test_honest_templates_and_expressions_are_untouched():
    delivery = integration.compile_post(
        integration.parse_delivery(
            {
                "fields": {
                    "name": "{{ lead.first_name ~ ' ' ~ lead.last_name }}",
                    "padded": "{{ lead.zip.zfill(10) }}",
                    "joined": "{{ ', '.join([lead.state, lead.zip]) }}",
                    "f": "{{ '{}-{}'.format(lead.state, lead.zip) }}",
                    "big": "{{ lead.note }}",
                },
                "accept": "result == 'ok'",
            }
        )
    )
    lead = {**integration.SAMPLE["lead"], "note": "n" * 200_000}
    body = json.loads(delivery.body({**integration.SAMPLE, "lead": lead}, b""))
    assert body["name"] == "Ada Lovelace" and body["padded"] == "0000073301" and body["joined"] == "TX, 73301"
    assert body["f"] == "TX-73301" and len(body["big"]) == 200_000
    assert delivery.accepted(json.dumps({"result": "ok", "pad": ["p" * 1000] * 60}).encode()) is True
    rule = integration.compile_expression("to_number(age) >= `25` && contains(['home', 'auto'], product)", "filter")
    assert integration.truthy(rule, {"age": "30", "product": "home", "note": "n" * 200_000})


# Chains of the str methods, operators and filters that grow a value, on a lead's field, with
# arguments small or huge: whatever the chain, a render makes at most a bounded amount.
_STEPS = st.sampled_from(
    [
        ".center({n})",
        ".ljust({n})",
        ".zfill({n})",
        ".expandtabs({n})",
        ".replace('a', 'b' * {n})",
        ".replace('', 'xy')",
        ".encode().hex()",
        " * {n}",
        " ~ lead.s",
        "|center({n})",
        "|indent({n})",
        "|replace('a', 'bb')",
        "|list|join('-' * {n})",
        "|tojson",
        "|upper",
    ]
)
_SIZES = st.sampled_from([1, 2, 10, 1000, 100_000, 10_000_000, 400_000_000])


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_STEPS, _SIZES), min_size=1, max_size=6))
# Found by this test: a method of `|tojson`'s Markup (a str subclass that escapes its arguments)
# went unmeasured, and its 50 MB result was made before the budget saw it.
@example([("|tojson", 1), (".replace('a', 'b' * {n})", 1000)])
@example([("|tojson", 1), (".replace('', 'xy')", 1)])
def test_any_template_chain_renders_within_its_allocation_budget(chain):
    expr = "(lead.s|default('a\tb'))"
    for step, n in chain:
        expr = f"({expr}{step.format(n=n)})"
    try:
        delivery = integration.compile_post(integration.parse_delivery({"fields": {"x": "{{ " + expr + " }}"}}))
    except ValidationError:
        return  # refused at PUT: the sample lead already went over
    context = {**integration.SAMPLE, "lead": {"s": "a\t" * 50_000}}
    tracemalloc.start()
    try:
        delivery.body(context, b"")
    except integration.RenderBudgetExceeded:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 64 * MB, (expr, peak)
