"""Strict JSON on every body Floodgate parses (docs/api.md, Conventions): NaN/Infinity/1e999,
duplicate keys, nesting deeper than 64 and non-UTF-8 are 400 invalid_json, never a 500."""

from __future__ import annotations

import pytest

from testkit.payments import counts, deliver, verdicts
from webhooks.errors import InvalidJSON, MalformedJSON
from webhooks.formats import strictjson

REFUSED = {
    "NaN": b'{"state": "TX", "score": NaN}',
    "Infinity": b'{"state": "TX", "score": -Infinity}',
    "overflowing number": b'{"state": "TX", "score": 1e999}',
    "overflowing integer": b'{"state": "TX", "score": 1' + b"0" * 400 + b"}",
    "duplicate key": b'{"state": "TX", "state": "OK"}',
    "nested 65 deep": b'{"x": ' + b"[" * 64 + b"]" * 64 + b"}",
    "nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
    "not UTF-8": b'{"state": "T\xe9X"}',
    "UTF-16": '{"state": "TX"}'.encode("utf-16"),
    "lone surrogate": b'{"state": "\\ud800"}',
}


@pytest.mark.parametrize("what", REFUSED)
def test_lead_body_the_strict_rules_refuse_is_invalid_json(api, what):
    key = api.put_publisher("surge")
    api.settle_config()
    resp = api.http.post(
        f"{api.base}/v1/leads",
        data=REFUSED[what],
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert resp.status_code == 400, (what, resp.text)
    assert resp.json()["error"]["code"] == "invalid_json", what


@pytest.mark.parametrize("what", REFUSED)
def test_admin_body_the_strict_rules_refuse_is_invalid_json(api, what):
    raw = REFUSED[what].replace(b'"state"', b'"name"')
    resp = api.http.put(
        f"{api.base}/v1/admin/publishers/surge", data=raw, headers={**api.admin, "Content-Type": "application/json"}
    )
    assert resp.status_code == 400, (what, resp.text)
    assert resp.json()["error"]["code"] == "invalid_json", what


@pytest.mark.parametrize("what", ["NaN", "overflowing number", "duplicate key", "nested 100000 deep", "not UTF-8"])
def test_signed_payment_body_the_strict_rules_refuse_is_invalid_json_and_credits_nothing(api, what):
    raw = {
        "NaN": b'{"event": "charge.success", "data": {"amount": NaN}}',
        "overflowing number": b'{"event": "charge.success", "data": {"amount": 1e999}}',
        "duplicate key": (
            b'{"event": "charge.success", "data": {"reference": "r1", "amount": 100,'
            b' "amount": 100000, "currency": "NGN", "customer": {"email": "a@b.co"}}}'
        ),
        "nested 100000 deep": REFUSED["nested 100000 deep"],
        "not UTF-8": b'{"event": "charge.success", "data": {"reference": "r\xff"}}',
    }[what]
    resp = deliver(api, "paystack", raw)  # signed with the real secret: only the JSON is wrong
    assert resp.status_code == 400, (what, resp.text)
    assert resp.json()["error"]["code"] == "invalid_json", what
    assert counts()["payments"] == 0
    assert verdicts("paystack") == ["invalid_json"]


def test_signed_payment_body_that_is_not_json_at_all_stays_invalid_payload(api):
    resp = deliver(api, "paystack", b"<xml>not json</xml>")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_payload"


def test_depth_64_and_escaped_pairs_are_still_json():
    assert strictjson.loads(b"[" * 64 + b"]" * 64) is not None
    assert strictjson.loads(b'{"brackets": "[[[[{{{{", "emoji": "\\ud83d\\ude00"}') == {
        "brackets": "[[[[{{{{",
        "emoji": "\U0001f600",
    }
    assert str(strictjson.loads(b"[12.50]", decimals=True)[0]) == "12.50"


def test_syntax_errors_are_told_apart_from_strict_refusals():
    with pytest.raises(MalformedJSON):
        strictjson.loads(b"{bad")
    with pytest.raises(InvalidJSON) as refused:
        strictjson.loads(b'{"a": 1, "a": 2}')
    assert not isinstance(refused.value, MalformedJSON)
