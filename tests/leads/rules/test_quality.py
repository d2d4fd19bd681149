"""Lead quality (docs/api.md "Publishers: limits, quality, test mode and payouts" `fields`, "Buyer
`filter`"): a publisher's field spec validates and normalises each lead before it is claimed;
a lead breaking it is 400 invalid_lead naming every failing field, and is not stored, routed
or counted; buyers, templates, filters and dedupe see the normalised values; a buyer's JMESPath
filter skips it with reason `filter`. Real buyers (a local HTTP server), Redis and database."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from webhooks.errors import InvalidLead, ValidationError
from webhooks.leads.rules.quality import parse_spec
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead

SPEC = {
    "email": {"type": "email", "required": True},
    "phone": {"type": "phone", "required": True, "region": "US"},
    "zip": {"type": "postal_code"},
    "age": {"type": "integer", "min": 18, "max": 99},
    "state": {"type": "enum", "values": ["TX", "OK", "CA"], "required": True},
    "loan": {"type": "number", "min": 500, "max": 50000},
    "name": {"type": "string", "max_length": 20},
    "homeowner": {"type": "boolean"},
}
GOOD = {"email": " Ada@Example.COM ", "phone": "(512) 555-0100", "state": "tx", "age": "42", "zip": "73301"}


def apply(spec: dict, lead: dict) -> dict:
    found = parse_spec(spec)
    assert found is not None
    return found.apply(lead)


# (type spec, value sent, stored value) and (type spec, value sent, the reason's start)
ACCEPTED = [
    ({"type": "string"}, "  Ada  ", "Ada"),
    ({"type": "string", "max_length": 3}, "abc", "abc"),
    ({"type": "email"}, " Ada.Lovelace@Example.COM ", "ada.lovelace@example.com"),
    ({"type": "email"}, "a+tag@sub.example.co.uk", "a+tag@sub.example.co.uk"),
    ({"type": "phone"}, "(512) 555-0100", "+15125550100"),
    ({"type": "phone"}, "+44 20 7946 0958", "+442079460958"),
    ({"type": "phone", "region": "GB"}, "020 7946 0958", "+442079460958"),
    ({"type": "phone"}, 5125550100, "+15125550100"),
    ({"type": "postal_code"}, "73301", "73301"),
    ({"type": "postal_code"}, " 73301-1234 ", "73301-1234"),
    ({"type": "postal_code"}, "73301\n", "73301"),  # trimmed, as every string value is
    ({"type": "email"}, "ada@example.com\r\n", "ada@example.com"),
    ({"type": "integer"}, 42, 42),
    ({"type": "integer"}, " 42 ", 42),
    ({"type": "integer"}, "-7", -7),
    ({"type": "integer"}, 42.0, 42),
    ({"type": "integer", "min": 18, "max": 99}, "18", 18),
    ({"type": "number"}, "1500.50", 1500.5),
    ({"type": "number"}, 12, 12),
    ({"type": "number", "max": 1.5}, 1.5, 1.5),
    ({"type": "enum", "values": ["TX", "OK"]}, "tx", "TX"),
    ({"type": "enum", "values": ["home", "auto"]}, "AUTO", "auto"),
    ({"type": "boolean"}, True, True),
    ({"type": "boolean"}, "yes", True),
    ({"type": "boolean"}, "FALSE", False),
    ({"type": "boolean"}, 0, False),
]
REFUSED = [
    ({"type": "string", "max_length": 3}, "abcd", "must be at most 3"),
    ({"type": "string"}, 12, "must be a string"),
    ({"type": "email"}, "not-an-email", "is not a valid e-mail"),
    ({"type": "email"}, "a@b", "is not a valid e-mail"),
    ({"type": "email"}, "ada@exa mple.com", "is not a valid e-mail"),
    ({"type": "email"}, "x" * 300 + "@example.com", "must be an e-mail"),
    ({"type": "email"}, ["ada@example.com"], "must be an e-mail"),
    ({"type": "phone"}, "abc", "is not a possible phone number"),
    ({"type": "phone"}, "12", "is not a possible phone number"),
    ({"type": "phone"}, "5" * 80, "must be a phone number"),
    ({"type": "phone"}, True, "must be a phone number"),
    ({"type": "postal_code"}, "7330", "must be a US ZIP"),
    ({"type": "postal_code"}, "73301\n1", "must be a US ZIP"),
    ({"type": "postal_code"}, "７３３０１", "must be a US ZIP"),
    ({"type": "postal_code"}, 73301, "must be a US ZIP"),
    ({"type": "integer"}, "abc", "must be a number"),
    ({"type": "integer"}, "4.5", "must be a whole number"),
    ({"type": "integer"}, "1_000", "must be a number"),
    ({"type": "integer"}, "١٢", "must be a number"),
    ({"type": "integer"}, "1e3", "must be a number"),
    ({"type": "integer"}, True, "must be a number"),
    ({"type": "integer", "min": 18}, 17, "must be at least 18"),
    ({"type": "integer", "max": 99}, "100", "must be at most 99"),
    ({"type": "number"}, "9" * 41, "must be a number"),
    ({"type": "number"}, 1e300, "must be a finite number"),
    ({"type": "number", "min": 500}, "499.99", "must be at least 500"),
    ({"type": "enum", "values": ["TX", "OK"]}, "NY", "must be one of TX, OK"),
    ({"type": "enum", "values": ["TX"]}, ["TX"], "must be one of TX"),
    ({"type": "boolean"}, "maybe", "must be true or false"),
    ({"type": "boolean"}, 2, "must be true or false"),
]


@pytest.mark.parametrize("rule, sent, stored", ACCEPTED)
def test_each_type_accepts_and_normalises(rule, sent, stored):
    out = apply({"f": rule}, {"f": sent, "other": {"kept": [1]}})
    assert out["f"] == stored and type(out["f"]) is type(stored)
    assert out["other"] == {"kept": [1]}  # undeclared fields pass through


@pytest.mark.parametrize("rule, sent, why", REFUSED)
def test_each_type_refuses_what_it_cannot_read(rule, sent, why):
    with pytest.raises(InvalidLead) as refused:
        apply({"f": rule}, {"f": sent})
    assert refused.value.fields["f"].startswith(why), refused.value.fields


def test_every_failing_field_is_named_at_once_and_absent_optional_ones_pass():
    with pytest.raises(InvalidLead) as refused:
        apply(SPEC, {"email": "nope", "state": "NY", "age": "abc", "zip": None, "name": ""})
    assert set(refused.value.fields) == {"email", "phone", "state", "age"}
    assert refused.value.fields["phone"] == "is required"
    assert apply(SPEC, GOOD) == {
        "email": "ada@example.com",
        "phone": "+15125550100",
        "state": "TX",
        "age": 42,
        "zip": "73301",
    }


@pytest.mark.parametrize(
    "spec, field",
    [
        ([], "fields"),
        ({"bad name!": {"type": "string"}}, "fields"),
        ({"a": {"type": "text"}}, "fields.a.type"),
        ({"a": "email"}, "fields.a.type"),
        ({"a": {"type": "email", "max_length": 3}}, "fields.a.max_length"),
        ({"a": {"type": "string", "max_length": 0}}, "fields.a.max_length"),
        ({"a": {"type": "string", "max_length": True}}, "fields.a.max_length"),
        ({"a": {"type": "phone", "region": "XX"}}, "fields.a.region"),
        ({"a": {"type": "integer", "min": 1.5}}, "fields.a.min"),
        ({"a": {"type": "integer", "min": 5, "max": 1}}, "fields.a.min"),
        ({"a": {"type": "enum"}}, "fields.a.values"),
        ({"a": {"type": "enum", "values": ["x", "X"]}}, "fields.a.values"),
        ({"state": {"type": "enum", "values": ["TX", "texas"]}}, "fields.state.values"),
        ({"a": {"type": "string", "required": "yes"}}, "fields.a.required"),
        ({"lead_id": {"type": "string"}}, "fields"),
        ({f"f{i}": {"type": "string"} for i in range(101)}, "fields"),
    ],
)
def test_a_spec_that_cannot_be_applied_is_refused_at_put(api, spec, field):
    with pytest.raises(ValidationError) as refused:
        parse_spec(spec)
    assert refused.value.field == field
    resp = api.http.put(
        f"{api.base}/v1/admin/publishers/surge",
        json={"name": "Surge", "api_key": "pk_test_surge_0123456789", "fields": spec},
        headers=api.admin,
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_publisher"


def test_the_spec_is_stored_and_shown(api):
    api.put_publisher("surge", fields=SPEC)
    shown = api.get("/v1/admin/publishers/surge").json()["fields"]
    assert shown["phone"] == {"type": "phone", "required": True, "region": "US"}
    assert shown["age"] == {"type": "integer", "min": 18, "max": 99}
    assert shown["zip"] == {"type": "postal_code"}


def test_a_lead_breaking_the_spec_is_400_naming_every_field_and_nothing_else_happens(api, buyer_server, worker):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge", fields=SPEC)
    api.put_buyer("acme", buyer_server.url("acme"), caps={"daily": 10})
    api.settle_config()
    resp = api.post_lead(key, {"lead_id": "bad-1", "email": "not-an-email", "age": "abc", "state": "TX"})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "invalid_lead"
    assert set(error["fields"]) == {"email", "age", "phone"}
    good = api.post_lead(key, {"lead_id": "good-1", **GOOD}).json()
    assert good["status"] == "sold"
    record = api.wait_settled("good-1", "surge")
    assert record["status"] == "sold"
    (received,) = acme.received  # the bad lead never reached a buyer
    assert received["body"]["lead"] == {
        "email": "ada@example.com",
        "phone": "+15125550100",
        "state": "TX",
        "age": 42,
        "zip": "73301",
    }
    assert api.get("/v1/admin/leads/bad-1", params={"publisher_id": "surge"}).status_code == 404
    assert api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == 1
    # the id of a refused lead is not taken: the corrected lead is routed under it
    fixed = api.post_lead(key, {"lead_id": "bad-1", **GOOD}).json()
    assert fixed["status"] == "sold" and "replayed" not in fixed


def test_200_concurrent_leads_mixing_valid_and_invalid_route_exactly_the_valid(api, buyer_server, worker):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge", fields=SPEC)
    api.put_buyer("acme", buyer_server.url("acme"), caps={"daily": 1000})
    api.settle_config()

    def lead(i: int) -> dict:
        body = {"lead_id": f"mix-{i:03}", **GOOD, "phone": f"512555{i:04}"}
        if i % 3 == 0:
            body["email"] = f"broken-{i}"
        if i % 7 == 0:
            body["state"] = "NY"
        return body

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda i: (i, api.post_lead(key, lead(i))), range(200)))
    valid = {f"mix-{i:03}" for i in range(200) if i % 3 and i % 7}
    for i, resp in answers:
        if f"mix-{i:03}" in valid:
            assert resp.status_code == 200 and resp.json()["status"] == "sold", resp.text
        else:
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_lead"
    assert {r["body"]["lead_id"] for r in acme.received} == valid
    assert api.get("/v1/admin/buyers/acme").json()["usage"]["daily"]["used"] == len(valid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with db.connection_context():
            stored = {row.lead_id for row in Lead.select(Lead.lead_id)}
        if len(stored) >= len(valid):
            break
        time.sleep(0.2)
    assert stored == valid


def test_dedupe_and_templates_see_the_normalised_values(api, buyer_server):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge", fields={"phone": {"type": "phone"}, "email": {"type": "email"}})
    api.put_buyer(
        "acme",
        buyer_server.url("acme"),
        dedupe={"fields": ["phone"], "days": 1},
        delivery={"fields": {"tel": "{{ lead.phone }}", "mail": "{{ lead.email }}"}},
    )
    api.settle_config()
    first = api.post_lead(key, {"lead_id": "d-1", "phone": "(512) 555-0100", "email": "A@B.CO"}).json()
    assert first["status"] == "sold"
    assert acme.received[0]["body"] == {"tel": "+15125550100", "mail": "a@b.co"}
    again = api.post_lead(key, {"lead_id": "d-2", "phone": "+1 512-555-0100"}).json()
    assert again["status"] == "unsold"  # the same consumer, written another way


FILTERS = [
    ("to_number(age) >= `25`", {"age": 30}, True),
    ("to_number(age) >= `25`", {"age": 20}, False),
    ("to_number(age) >= `25`", {}, False),  # missing field: to_number(null) is null
    ("contains(['home', 'auto'], product)", {"product": "auto"}, True),
    ("contains(['home', 'auto'], product)", {"product": "life"}, False),
    ("contains(['home', 'auto'], product)", {}, False),
    ("loan_amount > `1000` && state == 'TX'", {"loan_amount": 5000, "state": "TX"}, True),
    ("loan_amount > `1000`", {"loan_amount": "5000"}, False),  # a type error fails: skipped
    ("!homeowner", {}, True),
]


@pytest.mark.parametrize("expression, lead, sold", FILTERS)
def test_a_buyer_filter_takes_leads_by_any_field(api, buyer_server, expression, lead, sold):
    picky = buyer_server.add("picky")
    key = api.put_publisher("surge")
    api.put_buyer("picky", buyer_server.url("picky"), filter=expression)
    api.settle_config()
    answer = api.post_lead(key, {"lead_id": "f-1", **lead}).json()
    assert answer["status"] == ("sold" if sold else "unsold")
    assert len(picky.received) == (1 if sold else 0)
    assert api.get("/v1/admin/buyers/picky").json()["filter"] == expression


def test_a_filtered_buyer_is_skipped_with_reason_filter_in_the_trace(api, buyer_server, worker):
    buyer_server.add("picky")
    fallback = buyer_server.add("fallback")
    key = api.put_publisher("surge", fields={"age": {"type": "integer"}})
    api.put_buyer("picky", buyer_server.url("picky"), priority=1, filter="age >= `25`")
    api.put_buyer("fallback", buyer_server.url("fallback"), priority=2)
    api.settle_config()
    # "30" is normalised to 30 by the spec before the filter sees it
    assert api.post_lead(key, {"lead_id": "t-1", "age": "30"}).json()["buyer_id"] == "picky"
    assert api.post_lead(key, {"lead_id": "t-2", "age": "20"}).json()["buyer_id"] == "fallback"
    record = api.wait_settled("t-2", "surge")
    assert {"buyer_id": "picky", "reason": "filter"} in record["skipped"]
    assert len(fallback.received) == 1


@pytest.mark.parametrize("expression", ["", "age >=", "foo(", "x" * 1025, 42, ["a"]])
def test_a_filter_that_does_not_compile_is_refused_at_put(api, buyer_server, expression):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/picky",
        json={"name": "Picky", "endpoint_url": buyer_server.url("picky"), "price": "5.00", "filter": expression},
        headers=api.admin,
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_buyer" and "filter" in resp.json()["error"]["message"]


def test_256_kib_in_a_spec_field_is_refused_by_its_bound(api):
    key = api.put_publisher("surge", fields=SPEC)
    api.settle_config()
    for field in ("email", "phone", "age", "loan", "name", "state", "zip"):
        resp = api.post_lead(key, {**GOOD, field: "9" * (250 * 1024)})
        assert resp.status_code == 400 and field in resp.json()["error"]["fields"], field


def test_a_state_enum_holds_us_state_codes_as_buyers_states_do():
    spec = parse_spec({"state": {"type": "enum", "values": ["tx", " ok", "PR"]}})
    assert spec is not None and spec.fields[0].values == ("TX", "OK", "PR")
    assert spec.apply({"state": "ok"})["state"] == "OK"  # the code a buyer's states name
    with pytest.raises(ValidationError) as refused:
        parse_spec({"state": {"type": "enum", "values": ["TX", "Texas", "ZZ"]}})
    assert refused.value.field == "fields.state.values" and "'Texas', 'ZZ'" in str(refused.value)
    other = parse_spec({"product": {"type": "enum", "values": ["Texas"]}})  # another field: any values
    assert other is not None and other.fields[0].values == ("Texas",)
