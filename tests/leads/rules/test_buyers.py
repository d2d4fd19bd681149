"""Buyer endpoint URLs carry no credentials and no control characters, and no log line ever
shows a URL's user:password@."""

from __future__ import annotations

import json
import logging

import pytest

from testkit.servers import free_port
from webhooks.logs import JsonFormatter
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Buyer

REFUSED = {
    "user and password": "https://acme:s3cret@buyer.example/leads",
    "user only": "https://token123@buyer.example/leads",
    "empty userinfo": "https://@buyer.example/leads",
    "smuggled host": "http://buyer.example\\@evil.example/leads",
    "CRLF": "http://buyer.example/leads\r\nX-Injected: 1",
    "tab": "http://buyer.example/le\tads",
    "NUL": "http://buyer.example/leads\x00",
    "C1 control": "http://buyer.example/leads\x85",
    "space": "http://buyer.example/my leads",
}


@pytest.mark.parametrize("what", REFUSED)
def test_buyer_url_with_userinfo_or_control_characters_is_refused(api, what):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/acme",
        headers=api.admin,
        json={"name": "Acme", "endpoint_url": REFUSED[what], "price": "1.00"},
    )
    assert resp.status_code == 400, (what, resp.text)
    err = resp.json()["error"]
    assert err["code"] == "invalid_buyer" and err["message"].startswith("endpoint_url:"), err
    assert "s3cret" not in resp.text


def test_plain_http_and_https_urls_are_still_accepted(api):
    for url in ("https://buyer.example:8443/leads?src=fg&x=%40", "http://127.0.0.1:9100/acme"):
        resp = api.http.put(
            f"{api.base}/v1/admin/buyers/acme",
            headers=api.admin,
            json={"name": "Acme", "endpoint_url": url, "price": "1.00"},
        )
        assert resp.status_code == 200 and resp.json()["endpoint_url"] == url


def test_a_stored_url_with_credentials_never_reaches_a_log_line(api, caplog):
    """A buyer saved before the rule keeps working; its failing delivery is logged without
    the password."""
    key = api.put_publisher("surge")
    api.put_buyer("legacy", f"http://127.0.0.1:{free_port()}/leads")
    with db.connection_context():
        Buyer.update(endpoint_url=f"http://acme:s3cret-pw@127.0.0.1:{free_port()}/leads").execute()
    api.settle_config()
    with caplog.at_level(logging.INFO):
        assert api.post_lead(key, {"lead_id": "l1"}).json()["attempts"][0]["outcome"] == "error"
    lines = [JsonFormatter().format(r) for r in caplog.records]
    delivery = [json.loads(line) for line in lines if "call to" in line]  # webhooks/outbound.py
    assert delivery and "http://<redacted>@127.0.0.1" in delivery[0]["message"]
    assert not any("s3cret-pw" in line for line in lines)
