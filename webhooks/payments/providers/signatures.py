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

from cryptography.exceptions import InvalidSignature as BadEd25519

from webhooks.errors import InvalidSignature
from webhooks.standard_keys import PUBLIC_PREFIX, standard_key, standard_public_key

TOLERANCE_S = 300  # Stripe and Standard Webhooks: signed timestamps older (or newer) than this fail

# The headers each scheme reads, lower-case; also what the audit trail keeps of a webhook.
HEADERS: dict[str, tuple[str, ...]] = {
    "paystack": ("x-paystack-signature",),
    "flutterwave": ("verif-hash", "flutterwave-signature"),
    "monnify": ("monnify-signature",),
    "interswitch": ("x-interswitch-signature",),
    "stripe": ("stripe-signature",),
    "standard": ("webhook-id", "webhook-timestamp", "webhook-signature"),
}
# Headers whose value is (or may be) the shared secret itself: never stored.
SECRET_HEADERS = frozenset({"verif-hash", "flutterwave-signature"})


Verifier = Callable[[bytes, Mapping[str, str], str, float], None]


def _header(headers: Mapping[str, str], name: str) -> str:
    """The header's value (case-insensitive name); InvalidSignature when absent or empty."""
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    if not value:
        raise InvalidSignature(f"missing {name} header")
    return value


def _optional(headers: Mapping[str, str], name: str) -> str | None:
    try:
        return _header(headers, name)
    except InvalidSignature:
        return None


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
    """v3 `verif-hash`: the dashboard's secret hash, sent as is (it signs nothing). v4
    `flutterwave-signature` (when no verif-hash is sent): the secret hash as is, as Flutterwave's
    webhook page says, or base64 HMAC-SHA256 of the raw body keyed with it, as integrations
    compute it; neither is weaker than verif-hash (docs/payments.md "What each scheme is based on")."""
    if _optional(headers, "verif-hash") is None and (signature := _optional(headers, "flutterwave-signature")):
        mac = base64.b64encode(hmac.new(secret.encode(), raw, hashlib.sha256).digest())
        if not (_same(secret, signature) | _same(mac, signature.strip())):
            raise InvalidSignature("flutterwave-signature does not match the secret hash or the body")
        return
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


def _candidates(presented: str, version: str) -> list[bytes]:
    """The decoded signatures of `version` in a webhook-signature header (others are skipped)."""
    found = []
    for entry in presented.split():
        name, _, signature = entry.partition(",")
        if name != version:
            continue
        try:
            found.append(base64.b64decode(signature, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found


def verify_standard(raw: bytes, headers: Mapping[str, str], secret: str, now: float) -> None:
    """Standard Webhooks: webhook-signature holds space-separated `v1,<base64>` entries, each an
    HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>" keyed with the decoded whsec_ secret,
    and `v1a,<base64>` entries, each an ed25519 signature of the same bytes, checked with a
    `whpk_` public key (the specification's asymmetric scheme)."""
    msg_id = _header(headers, "webhook-id")
    timestamp = _header(headers, "webhook-timestamp")
    presented = _header(headers, "webhook-signature")
    _fresh(timestamp, now)
    signed = f"{msg_id}.{timestamp}.".encode() + raw
    if secret.startswith(PUBLIC_PREFIX):
        key = standard_public_key(secret)
        for candidate in _candidates(presented, "v1a"):
            try:
                key.verify(candidate, signed)
                return
            except BadEd25519:
                continue
        raise InvalidSignature("no v1a signature in webhook-signature matches the body")
    expected = hmac.new(standard_key(secret), signed, hashlib.sha256).digest()
    if any(_same(expected, candidate) for candidate in _candidates(presented, "v1")):
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
