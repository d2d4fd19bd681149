"""Secrets: two per provider variable while rotating, unusable ones stop start-up with a clear
message (never showing the secret), and the Authorization scheme in any case."""

from __future__ import annotations

import subprocess

import pytest

from testkit.payments import PROVIDERS, SECRET, balance, deliver, encode, payload, signed_headers
from testkit.servers import ROOT, free_port, venv_bin
from tests.conftest import ADMIN_TOKEN, SECRETS
from webhooks import config, services
from webhooks.errors import ConfigError

OLD = {
    "paystack": "sk_old_paystack_secret",
    "flutterwave": "flw-old-secret-hash",
    "monnify": "monnify-old",
    "interswitch": "interswitch-old",
    "stripe": "whsec_old_stripe_secret",
    "standard": "whsec_b2xkLXN0YW5kYXJkLXNlY3JldC1rZXk=",
}
STRANGER = "whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ=="


def test_a_variable_may_hold_the_old_and_the_new_secret():
    env = {config.PROVIDER_SECRETS[p]: f"{OLD[p]} {SECRET[p]}" for p in PROVIDERS}
    cfg = config.load(env)
    assert cfg.secrets == {p: (OLD[p], SECRET[p]) for p in PROVIDERS}
    assert config.load({"PAYSTACK_SECRET_KEY": "  one  "}).secrets == {"paystack": ("one",)}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_during_a_rotation_deliveries_signed_with_either_secret_are_credited(api, reconfigure, provider):
    reconfigure(secrets={**services.of(api.app).config.secrets, provider: (OLD[provider], SECRET[provider])})
    for i, secret in enumerate((OLD[provider], SECRET[provider])):
        raw = encode(payload(provider, f"{provider}-rot-{i}", 1000))
        resp = deliver(api, provider, raw, headers=signed_headers(provider, raw, secret=secret))
        assert resp.json() == {"status": "credited"}, (secret, resp.text)
    raw = encode(payload(provider, f"{provider}-rot-x", 1000))
    resp = deliver(api, provider, raw, headers=signed_headers(provider, raw, secret=STRANGER))
    assert resp.status_code == 401
    assert balance("ada@example.com", "NGN") == 2000


@pytest.mark.parametrize(
    "env, names",
    [
        ({"STANDARD_WEBHOOK_SECRET": "whsec_not*base64!"}, ("STANDARD_WEBHOOK_SECRET", "base64")),
        ({"STANDARD_WEBHOOK_SECRET": "whsec_"}, ("STANDARD_WEBHOOK_SECRET", "decodes to no bytes")),
        ({"STANDARD_WEBHOOK_SECRET": "whsec_abcde"}, ("STANDARD_WEBHOOK_SECRET", "base64")),
        (
            {"STANDARD_WEBHOOK_SECRET": f"{SECRETS['STANDARD_WEBHOOK_SECRET']} whsec_#bad#"},
            ("STANDARD_WEBHOOK_SECRET", "secret 2 of 2"),
        ),
        ({"PAYSTACK_SECRET_KEY": "one two three"}, ("PAYSTACK_SECRET_KEY", "at most two")),
        ({"STANDARD_WEBHOOK_PUBLIC_KEY": "whpk_not*base64!"}, ("STANDARD_WEBHOOK_PUBLIC_KEY", "base64")),
        ({"STANDARD_WEBHOOK_PUBLIC_KEY": "whpk_" + "A" * 40}, ("STANDARD_WEBHOOK_PUBLIC_KEY", "30 bytes", "32")),
        ({"STANDARD_WEBHOOK_PUBLIC_KEY": "whsec_" + "A" * 43}, ("STANDARD_WEBHOOK_PUBLIC_KEY", "whpk_")),
        ({"ADMIN_TOKEN": "short-admin-token"}, ("ADMIN_TOKEN", "at least 24")),
        ({"SUPPRESSION_KEY": "a-short-suppression-key"}, ("SUPPRESSION_KEY", "at least 32")),
        ({"FLUTTERWAVE_VERIFY": "1"}, ("FLUTTERWAVE_SECRET_KEY",)),
        ({"FLUTTERWAVE_SECRET_HASH": "fifteen-chars-x"}, ("FLUTTERWAVE_SECRET_HASH", "15 characters", "at least 16")),
        (
            {"FLUTTERWAVE_SECRET_HASH": "a-long-enough-old-hash short-new-hash"},
            ("FLUTTERWAVE_SECRET_HASH", "secret 2 of 2", "at least 16"),
        ),
    ],
)
def test_an_unusable_secret_stops_loading_with_a_clear_message(env, names):
    with pytest.raises(ConfigError) as refused:
        config.load(env)
    message = refused.value.message
    assert all(name in message for name in names), message
    for value in env.values():
        assert len(value) < 8 or value not in message  # the message never shows the secret
        assert not any(len(secret) >= 8 and secret in message for secret in value.split())


def test_suppression_key_defaults_to_the_development_key_and_takes_a_long_one():
    assert config.load({}).suppression_key == "floodgate-development-suppression-key"
    assert config.load({"SUPPRESSION_KEY": "k" * 32}).suppression_key == "k" * 32


def test_a_flutterwave_secret_hash_of_16_characters_is_accepted():
    one = config.load({"FLUTTERWAVE_SECRET_HASH": "sixteen-chars-xy"})
    assert one.secrets == {"flutterwave": ("sixteen-chars-xy",)}
    both = "old-hash-16-char new-hash-16-char"
    assert config.load({"FLUTTERWAVE_SECRET_HASH": both}).secrets["flutterwave"] == tuple(both.split())


def test_a_standard_public_key_joins_the_standard_secrets():
    key = "whpk_" + "A" * 43  # 32 zero bytes, unpadded
    assert config.load({"STANDARD_WEBHOOK_PUBLIC_KEY": key}).secrets == {"standard": (key,)}
    both = config.load(
        {"STANDARD_WEBHOOK_SECRET": SECRETS["STANDARD_WEBHOOK_SECRET"], "STANDARD_WEBHOOK_PUBLIC_KEY": key}
    )
    assert both.secrets["standard"] == (SECRETS["STANDARD_WEBHOOK_SECRET"], key)


@pytest.mark.e2e  # starts gunicorn
@pytest.mark.parametrize(
    "var, value, message",
    [
        ("STANDARD_WEBHOOK_SECRET", "whsec_%%not-base64%%", "secret 1 of 1 is not valid base64"),
        ("FLUTTERWAVE_SECRET_HASH", "flw%%too-short", "secret 1 of 1 is 14 characters; it must be at least 16"),
    ],
)
def test_gunicorn_does_not_start_with_an_unusable_secret(base_env, tmp_path, var, value, message):
    env = {**base_env, var: value, "PORT": str(free_port())}
    done = subprocess.run(
        [venv_bin("gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"floodgate: configuration error: {var}: {message}" in done.stderr, done.stderr[-2000:]
    assert value not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_authorization_scheme_is_case_insensitive(api, scheme):
    resp = api.http.get(f"{api.base}/v1/admin/buyers/nobody", headers={"Authorization": f"{scheme} {ADMIN_TOKEN}"})
    assert resp.status_code == 404  # authenticated: the buyer just does not exist
    key = api.put_publisher("surge")
    api.settle_config()
    lead = api.http.post(f"{api.base}/v1/leads", json={"lead_id": "l1"}, headers={"Authorization": f"{scheme} {key}"})
    assert lead.status_code == 200 and lead.json()["status"] == "unsold", lead.text


@pytest.mark.parametrize("header", ["Basic " + ADMIN_TOKEN, ADMIN_TOKEN, "Bearer", "Bearer" + ADMIN_TOKEN])
def test_other_schemes_and_malformed_headers_are_401(api, header):
    resp = api.http.get(f"{api.base}/v1/admin/buyers/nobody", headers={"Authorization": header})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"
