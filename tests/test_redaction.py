"""Secrets as the admin API and the logs show them (docs/api.md "Nothing outside can stall or
exhaust Floodgate", docs/buyers.md "Secrets as GET shows them"): nothing of a short secret,
no secret query value of a URL; what GET shows, sent back unchanged, keeps the stored value."""

from __future__ import annotations

import json

import pytest

from webhooks.logs import redact_secret, redact_url
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Buyer, EventEndpoint

URL_SECRETS = {
    "api_key": "sk_live_url_secret_1",
    "token": "tok_url_secret_2",
    "access_token": "at_url_secret_3",
    "signature": "sig_url_secret_4",
    "sig": "s_url_secret_5",
    "password": "pw_url_secret_6",
    "auth": "auth_url_secret_7",
    "Api%5FKey": "enc_url_secret_8",  # `Api_Key`, percent-encoded
}
QUERY = "&".join(f"{name}={value}" for name, value in URL_SECRETS.items())


@pytest.mark.parametrize("secret", ["k", "abcd", "abcde", "sk_12345", "0123456789abcde"])
def test_nothing_of_a_secret_shorter_than_16_characters_is_shown(secret):
    shown = redact_secret(secret)
    assert shown == "****"
    assert not any(secret[-n:] in shown for n in range(1, len(secret) + 1) if secret[-n:] != "*")


def test_a_long_secret_shows_its_last_4_characters_only():
    assert redact_secret("sk_live_0123456789wxyz") == "****wxyz"


def test_secret_query_values_of_a_url_are_redacted_and_the_others_kept():
    shown = redact_url(f"https://buyer.example/post?campaign=spring&{QUERY}&sub_id=7#top")
    assert not [value for value in URL_SECRETS.values() if value in shown], shown
    assert shown.startswith("https://buyer.example/post?campaign=spring&api_key=<redacted>&")
    assert shown.endswith("&sub_id=7#top")


def _put(api, path: str, body: dict):
    return api.http.put(f"{api.base}{path}", json=body, headers=api.admin)


def _get_back(api, path: str) -> dict:
    got = api.get(path).json()
    return {k: v for k, v in got.items() if k not in ("id", "usage", "breaker", "created_at", "updated_at")}


def test_a_short_buyer_header_is_shown_as_nothing_and_kept_when_sent_back(api, buyer_server):
    acme = buyer_server.add("acme")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"), delivery={"headers": {"X-Key": "abcd", "X-Pin": "a1b2c3d4e5"}})
    got = _get_back(api, "/v1/admin/buyers/acme")
    assert got["delivery"]["headers"] == {"X-Key": "****", "X-Pin": "****"}
    preview = api.http.post(f"{api.base}/v1/admin/buyers/acme/preview", json={"lead_id": "p"}, headers=api.admin)
    assert preview.json()["headers"]["X-Key"] == "****" and "abcd" not in preview.text and "e5" not in preview.text
    assert (sent := _put(api, "/v1/admin/buyers/acme", got)).status_code == 200, sent.text
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "short-header"}).json()["status"] == "sold"
    assert acme.received[0]["headers"]["X-Key"] == "abcd" and acme.received[0]["headers"]["X-Pin"] == "a1b2c3d4e5"


def test_secrets_in_buyer_urls_are_redacted_by_get_and_kept_when_sent_back(api, buyer_server):
    target = f"acme?{QUERY}"
    acme = buyer_server.add(target)
    key = api.put_publisher("surge")
    url = buyer_server.url(target)
    ping_url = "https://ping.example/bid?key=pk_ping_secret_9&state=CA"
    ping = {"url": ping_url, "bid": "price"}
    api.put_buyer("acme", url, ping=ping)
    got = _get_back(api, "/v1/admin/buyers/acme")
    preview = api.http.post(f"{api.base}/v1/admin/buyers/acme/preview", json={"lead_id": "p"}, headers=api.admin)
    shown = json.dumps(got) + preview.text
    for secret in [*URL_SECRETS.values(), "pk_ping_secret_9"]:
        assert secret not in shown, secret
    assert got["ping"]["url"] == "https://ping.example/bid?key=<redacted>&state=CA"

    got["price"] = "12.00"  # GET's form sent back, something else changed: the URLs are kept
    assert (sent := _put(api, "/v1/admin/buyers/acme", got)).status_code == 200, sent.text
    with db.connection_context():
        row = Buyer.get_by_id("acme")
        assert row.endpoint_url == url and json.loads(row.ping)["url"] == ping_url
    api.put_buyer("acme", url)  # no ping: the post goes to the stored URL, secrets and all
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "url-secret"}).json()["status"] == "sold"
    assert len(acme.received) == 1

    moved = {**got, "ping": None, "endpoint_url": got["endpoint_url"].replace("/acme?", "/other?")}
    refused = _put(api, "/v1/admin/buyers/acme", moved)
    assert refused.status_code == 400 and "endpoint_url" in refused.text and "<redacted>" in refused.text


def test_a_secret_in_an_event_endpoint_url_is_redacted_by_get_and_kept_when_sent_back(api):
    url = "https://app.example/hooks?token=tok_event_secret_10&v=2"
    assert _put(api, "/v1/admin/event-endpoints/app", {"url": url}).status_code == 200
    got = _get_back(api, "/v1/admin/event-endpoints/app")
    listed = api.get("/v1/admin/event-endpoints").text
    assert got["url"] == "https://app.example/hooks?token=<redacted>&v=2" and "tok_event_secret_10" not in listed
    sent_back = {k: v for k, v in got.items() if k in ("url", "types", "publisher_id", "secret", "enabled")}
    assert _put(api, "/v1/admin/event-endpoints/app", sent_back).status_code == 200
    with db.connection_context():
        assert EventEndpoint.get_by_id("app").url == url


def test_the_managed_endpoint_with_a_secret_in_its_url_can_still_be_paused(api):
    from webhooks.events import endpoints

    url = "https://app.example/hooks?token=tok_managed_secret_11"
    with db.connection_context():
        endpoints.sync_managed(url, ("whsec_" + "A" * 32,))
    path = f"/v1/admin/event-endpoints/{endpoints.MANAGED_ID}"
    shown = _get_back(api, path)
    assert shown["url"] == "https://app.example/hooks?token=<redacted>"
    assert _put(api, path, {**shown, "enabled": False}).status_code == 200  # GET's form sent back
    assert _put(api, path, {"url": url, "enabled": True}).status_code == 200  # or the URL in full
    assert _put(api, path, {"url": "https://elsewhere.example/"}).status_code == 409
