"""A delivery that fails its signature check leaves a metric and a metadata row (provider,
length, body hash), never its body or headers: no one fills the database without a secret."""
from __future__ import annotations

import hashlib
import json
import re

import pytest

from tests.payments_helpers import PROVIDERS, deliver, encode, payload, signed_headers
from webhooks.storage.db import db
from webhooks.storage.models import WebhookDelivery

MARKER = "forged-marker-7d1c"


def rows() -> list[WebhookDelivery]:
    with db.connection_context():
        return list(WebhookDelivery.select().order_by(WebhookDelivery.id))


def rejected_count(api, provider: str) -> float:
    text = api.http.get(api.base + "/metrics").text
    pattern = (r'^floodgate_payment_deliveries_total\{provider="%s",status="invalid_signature"\} (\S+)$'
               % provider)
    match = re.search(pattern, text, re.M)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_forged_delivery_keeps_only_provider_length_and_hash(api, provider):
    body = payload(provider, f"{MARKER}-ref", 100000, email=f"{MARKER}@example.com")
    raw = encode(body) + b" " * 200_000  # a big body: none of it may be stored
    wrong = signed_headers(provider, raw, secret="whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ==")
    before = rejected_count(api, provider)
    resp = deliver(api, provider, raw, headers={**wrong, "User-Agent": MARKER})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_signature"
    (row,) = rows()
    assert (row.provider, row.verdict, row.status_code) == (provider, "invalid_signature", 401)
    assert (row.body_length, row.body_sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
    assert bytes(row.body) == b"" and json.loads(row.headers) == {}
    assert row.reference is None and row.event_type is None
    assert MARKER not in repr(row.__data__)
    assert rejected_count(api, provider) == before + 1


def test_unsigned_flood_stores_no_bytes_of_the_bodies(api):
    for i in range(20):
        deliver(api, "paystack", f'{{"junk": "{MARKER}{i}", "pad": "{"x" * 60_000}"}}'.encode(), headers={})
    stored = rows()
    assert len(stored) == 20
    assert sum(len(bytes(r.body)) + len(r.headers) for r in stored) == 40  # twenty "{}"


def test_verified_delivery_keeps_body_headers_and_the_same_metadata(api):
    raw = encode(payload("paystack", "ps-kept", 5000))
    assert deliver(api, "paystack", raw).json() == {"status": "credited"}
    (row,) = rows()
    assert bytes(row.body) == raw and "x-paystack-signature" in json.loads(row.headers)
    assert (row.body_length, row.body_sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
