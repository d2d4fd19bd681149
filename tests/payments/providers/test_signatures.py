"""Signature checks alone: pure functions, signed by the providers' own libraries where they exist."""

from __future__ import annotations

import base64
import hashlib
import time

import pytest
import stripe
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from testkit.payments import (
    PROVIDERS,
    SECRET,
    encode,
    flutterwave_v4_headers,
    payload,
    signed_headers,
    standard_v1a_headers,
    whpk,
)
from webhooks.payments.providers.signatures import InvalidSignature, verify

NOW = time.time()


@pytest.fixture(autouse=True)
def _now() -> None:
    """Each test's own now: a module-level one is minutes old by the time a slow run gets here,
    and the deliveries signed at the real time fall outside its 5 minutes."""
    global NOW
    NOW = time.time()


def body(provider: str) -> bytes:
    return encode(payload(provider, "ref-1", 12345))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_genuine_webhook_call_verifies(provider):
    raw = body(provider)
    verify(provider, raw, signed_headers(provider, raw), SECRET[provider], NOW)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_header_names_are_case_insensitive(provider):
    raw = body(provider)
    headers = {k.upper(): v for k, v in signed_headers(provider, raw).items()}
    verify(provider, raw, headers, SECRET[provider], NOW)


@pytest.mark.parametrize("provider", [p for p in PROVIDERS if p != "flutterwave"])
def test_tampered_body_is_refused(provider):
    raw = body(provider)
    headers = signed_headers(provider, raw)
    with pytest.raises(InvalidSignature):
        verify(provider, raw.replace(b"ada@", b"eve@"), headers, SECRET[provider], NOW)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_wrong_secret_is_refused(provider):
    raw = body(provider)
    wrong = "whsec_" + "d3Jvbmctc2VjcmV0LXdyb25nLXNlY3JldA==" if provider == "standard" else "not-the-secret"
    with pytest.raises(InvalidSignature):
        verify(provider, raw, signed_headers(provider, raw, secret=wrong), SECRET[provider], NOW)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_missing_header_is_refused(provider):
    raw = body(provider)
    for dropped in signed_headers(provider, raw):
        headers = {k: v for k, v in signed_headers(provider, raw).items() if k != dropped}
        with pytest.raises(InvalidSignature, match="missing"):
            verify(provider, raw, headers, SECRET[provider], NOW)


@pytest.mark.parametrize("provider", ["stripe", "standard"])
@pytest.mark.parametrize("skew", [-301, 301])
def test_timestamp_outside_five_minutes_is_refused(provider, skew):
    raw = body(provider)
    headers = signed_headers(provider, raw, at=NOW + skew)
    with pytest.raises(InvalidSignature, match="300 s"):
        verify(provider, raw, headers, SECRET[provider], NOW)


@pytest.mark.parametrize("provider", ["stripe", "standard"])
def test_timestamp_within_tolerance_is_accepted(provider):
    raw = body(provider)
    verify(provider, raw, signed_headers(provider, raw, at=NOW - 290), SECRET[provider], NOW)


def test_stripe_accepts_any_matching_v1_among_several():
    raw = body("stripe")
    good = stripe.WebhookSignature.generate_signature_header(raw.decode(), SECRET["stripe"], int(NOW))
    t, v1 = good.split(",")
    header = f"{t},v1={'0' * 64},{v1},v0=deadbeef"
    verify("stripe", raw, {"Stripe-Signature": header}, SECRET["stripe"], NOW)


def test_stripe_verdicts_agree_with_the_stripe_library():
    raw = body("stripe")
    header = stripe.WebhookSignature.generate_signature_header(raw.decode(), SECRET["stripe"], int(NOW))
    for candidate in (raw, raw + b" "):
        try:
            stripe.WebhookSignature.verify_header(candidate, header, SECRET["stripe"], 300)
            theirs = True
        except stripe.SignatureVerificationError:
            theirs = False
        try:
            verify("stripe", candidate, {"Stripe-Signature": header}, SECRET["stripe"], time.time())
            ours = True
        except InvalidSignature:
            ours = False
        assert ours == theirs


def test_standard_accepts_any_matching_v1_and_skips_other_versions():
    raw = body("standard")
    headers = signed_headers("standard", raw)
    headers["webhook-signature"] = "v1a,AAAA v1,Zm9v " + headers["webhook-signature"]
    verify("standard", raw, headers, SECRET["standard"], NOW)
    assert Webhook(SECRET["standard"]).verify(raw, headers)  # the reference library agrees


def test_standard_verdicts_agree_with_the_reference_library():
    raw = body("standard")
    headers = signed_headers("standard", raw)
    headers["webhook-id"] = "msg_other"
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET["standard"]).verify(raw, headers)
    with pytest.raises(InvalidSignature):
        verify("standard", raw, headers, SECRET["standard"], NOW)


def test_flutterwave_verif_hash_must_equal_the_secret_hash():
    raw = body("flutterwave")
    with pytest.raises(InvalidSignature):
        verify("flutterwave", raw, {"verif-hash": SECRET["flutterwave"] + "x"}, SECRET["flutterwave"], NOW)


@pytest.mark.parametrize("provider", ["paystack", "monnify", "interswitch"])
def test_hex_signatures_accept_upper_case_hex(provider):
    raw = body(provider)
    headers = {k: v.upper() for k, v in signed_headers(provider, raw).items()}
    verify(provider, raw, headers, SECRET[provider], NOW)


@pytest.mark.parametrize("header", ["t=abc,v1=00", "v1=00", "t=1", "garbage", "t=1,v1=ünïcode"])
def test_malformed_stripe_header_is_refused_not_crashing(header):
    with pytest.raises(InvalidSignature):
        verify("stripe", b"{}", {"Stripe-Signature": header}, SECRET["stripe"], NOW)


def test_flutterwave_signature_is_the_secret_hash_or_the_body_s_base64_hmac():
    raw = body("flutterwave")
    secret = SECRET["flutterwave"]
    verify("flutterwave", raw, flutterwave_v4_headers(raw), secret, NOW)
    verify("flutterwave", raw, {"flutterwave-signature": secret}, secret, NOW)
    for headers in (
        flutterwave_v4_headers(raw + b" "),  # another body
        flutterwave_v4_headers(raw, secret + "x"),  # another secret
        {"flutterwave-signature": secret + "x"},
        {"flutterwave-signature": ""},
        {"flutterwave-signature": base64.b64encode(hashlib.sha256(raw).digest()).decode()},  # no key
    ):
        with pytest.raises(InvalidSignature):
            verify("flutterwave", raw, headers, secret, NOW)


def test_a_wrong_verif_hash_is_not_rescued_by_a_flutterwave_signature():
    raw = body("flutterwave")
    headers = {"verif-hash": "wrong", **flutterwave_v4_headers(raw)}
    with pytest.raises(InvalidSignature):
        verify("flutterwave", raw, headers, SECRET["flutterwave"], NOW)


def test_standard_v1a_ed25519_verifies_with_the_whpk_public_key():
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    raw = body("standard")
    headers = standard_v1a_headers(raw, key)
    verify("standard", raw, headers, whpk(key), NOW)
    # beside a whsec_ secret (rotation, or both schemes configured): either may verify
    verify("standard", raw, headers, (SECRET["standard"], whpk(key)), NOW)
    verify("standard", raw, headers, (whpk(other), whpk(key)), NOW)  # the sender's key rotated
    # among other entries, as a v1 and a v1a may travel together
    headers["webhook-signature"] = "v1,Zm9v v1a,!!! " + headers["webhook-signature"]
    verify("standard", raw, headers, whpk(key), NOW)


@pytest.mark.parametrize(
    "what",
    ["another key", "another body", "another id", "stale timestamp", "as v1", "whsec_ only", "truncated"],
)
def test_standard_v1a_refuses_what_the_key_did_not_sign(what):
    key = Ed25519PrivateKey.generate()
    raw = body("standard")
    signer, at, public, secret_raw = key, NOW, whpk(key), raw
    if what == "another key":
        signer = Ed25519PrivateKey.generate()
    if what == "stale timestamp":
        at = NOW - 301
    headers = standard_v1a_headers(raw, signer, at)
    if what == "another body":
        secret_raw = raw + b" "
    if what == "another id":
        headers["webhook-id"] = "msg_other"
    if what == "as v1":
        headers["webhook-signature"] = headers["webhook-signature"].replace("v1a,", "v1,")
    if what == "truncated":
        headers["webhook-signature"] = headers["webhook-signature"][:-8]
    secrets = SECRET["standard"] if what == "whsec_ only" else public
    with pytest.raises(InvalidSignature):
        verify("standard", secret_raw, headers, secrets, NOW)
