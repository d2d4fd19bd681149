"""Webhook signature checks: pure functions of (raw body, headers, secret, now), no Flask.

Each verifier raises InvalidSignature or returns None. Every comparison of a secret-derived
value goes through hmac.compare_digest; see docs/payments.md for each scheme's source.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence

from webhooks.errors import InvalidSignature

TOLERANCE_S = 300  # Stripe and Standard Webhooks: signed timestamps older (or newer) than this fail

# The headers each scheme reads, lower-case; also what the audit trail keeps of a webhook.
HEADERS: dict[str, tuple[str, ...]] = {
    "paystack": ("x-paystack-signature",),
    "flutterwave": ("verif-hash",),
    "monnify": ("monnify-signature",),
    "interswitch": ("x-interswitch-signature",),
    "stripe": ("stripe-signature",),
    "standard": ("webhook-id", "webhook-timestamp", "webhook-signature"),
}
# Headers whose value is the shared secret itself: never stored.
SECRET_HEADERS = frozenset({"verif-hash"})


Verifier = Callable[[bytes, Mapping[str, str], str, float], None]


def _header(headers: Mapping[str, str], name: str) -> str:
    """The header's value (case-insensitive name); InvalidSignature when absent or empty."""
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    if not value:
        raise InvalidSignature(f"missing {name} header")
    return value


def _same(expected: str | bytes, presented: str | bytes) -> bool:
    as_bytes = [x.encode() if isinstance(x, str) else x for x in (expected, presented)]
    return hmac.compare_digest(as_bytes[0], as_bytes[1])


def _hex_hmac_sha512(raw: bytes, headers: Mapping[str, str], secret: str, name: str) -> None:
    presented = _header(headers, name).strip().lower()
    expected = hmac.new(secret.encode(), raw, hashlib.sha512).hexdigest()
    if not _same(expected, presented):
        raise InvalidSignature(f"{name} does not match the body")


def _fresh(timestamp: str, now: float) -> int:
    try:
        ts = int(timestamp)
    except ValueError:
        raise InvalidSignature("signature timestamp is not an integer") from None
    if abs(now - ts) > TOLERANCE_S:
        raise InvalidSignature(f"signature timestamp is more than {TOLERANCE_S} s away from now")
    return ts


def verify_paystack(raw: bytes, headers: Mapping[str, str], secret: str, now: float) -> None:
    """x-paystack-signature: hex HMAC-SHA512 of the raw body, keyed with the secret key."""
    _hex_hmac_sha512(raw, headers, secret, "x-paystack-signature")


def verify_flutterwave(raw: bytes, headers: Mapping[str, str], secret: str, now: float) -> None:
    """verif-hash: the secret hash set on the dashboard, sent as is (it signs nothing)."""
    if not _same(secret, _header(headers, "verif-hash")):
        raise InvalidSignature("verif-hash does not match the configured secret hash")


def verify_monnify(raw: bytes, headers: Mapping[str, str], secret: str, now: float) -> None:
    """monnify-signature: hex HMAC-SHA512 of the raw body, keyed with the client secret."""
    _hex_hmac_sha512(raw, headers, secret, "monnify-signature")


def verify_interswitch(raw: bytes, headers: Mapping[str, str], secret: str, now: float) -> None:
    """X-Interswitch-Signature: hex HMAC-SHA512 of the raw body, keyed with the secret key."""
    _hex_hmac_sha512(raw, headers, secret, "x-interswitch-signature")


def verify_stripe(raw: bytes, headers: Mapping[str, str], secret: str, now: float) -> None:
    """Stripe-Signature `t=<ts>,v1=<hex>[,v1=...]`: HMAC-SHA256 of "<ts>.<body>" keyed with the
    whole endpoint secret; any one v1 may match (secret rolling), within the tolerance."""
    timestamp, candidates = None, []
    for item in _header(headers, "stripe-signature").split(","):
        key, _, value = item.strip().partition("=")
        if key == "t":
            timestamp = value
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        raise InvalidSignature("stripe-signature has no t= or no v1= signature")
    signed = timestamp.encode() + b"." + raw
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    if not any(_same(expected, c) for c in candidates):
        raise InvalidSignature("no v1 signature in stripe-signature matches the body")
    _fresh(timestamp, now)


def standard_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: base64 after an optional `whsec_` prefix
    (padding may be left off). ValueError, naming the problem but never the secret, when it
    is not base64 or decodes to nothing: config.load() stops start-up on it."""
    encoded = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64 (after its whsec_ prefix)") from None
    if not key:
        raise ValueError("decodes to no bytes")
    return key


def verify_standard(raw: bytes, headers: Mapping[str, str], secret: str, now: float) -> None:
    """Standard Webhooks: webhook-signature holds space-separated `v1,<base64>` entries, each an
    HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>" keyed with the decoded whsec_ secret."""
    msg_id = _header(headers, "webhook-id")
    timestamp = _header(headers, "webhook-timestamp")
    presented = _header(headers, "webhook-signature")
    _fresh(timestamp, now)
    signed = f"{msg_id}.{timestamp}.".encode() + raw
    expected = hmac.new(standard_key(secret), signed, hashlib.sha256).digest()
    for entry in presented.split():
        version, _, signature = entry.partition(",")
        if version != "v1":
            continue
        try:
            candidate = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            continue
        if _same(expected, candidate):
            return
    raise InvalidSignature("no v1 signature in webhook-signature matches the body")


VERIFIERS: dict[str, Verifier] = {
    "paystack": verify_paystack,
    "flutterwave": verify_flutterwave,
    "monnify": verify_monnify,
    "interswitch": verify_interswitch,
    "stripe": verify_stripe,
    "standard": verify_standard,
}


def verify(provider: str, raw: bytes, headers: Mapping[str, str], secrets: str | Sequence[str], now: float) -> None:
    """Run `provider`'s check; raise InvalidSignature unless the webhook is authentic with
    one of `secrets` (one secret, or the old and the new one while it is being rotated)."""
    failure = InvalidSignature("no secret configured")
    for secret in (secrets,) if isinstance(secrets, str) else secrets:
        try:
            VERIFIERS[provider](raw, headers, secret, now)
            return
        except InvalidSignature as exc:
            failure = exc
    raise failure
