"""The keys of Standard Webhooks: a `whsec_` secret's HMAC key and a `whpk_` public key, read
where the configuration is checked at start-up (config.py) and where a signature is verified
(payments/signatures.py)."""

from __future__ import annotations

import base64
import binascii

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

PUBLIC_PREFIX = "whpk_"  # a Standard Webhooks public key (its secret key is whsk_, never ours)


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


def standard_public_key(value: str) -> Ed25519PublicKey:
    """The ed25519 public key of a Standard Webhooks `whpk_` value: base64 of the key's 32 raw
    bytes (padding may be left off). ValueError, never showing the value, when it is not one."""
    if not value.startswith(PUBLIC_PREFIX):
        raise ValueError(f"does not start with {PUBLIC_PREFIX}")
    encoded = value.removeprefix(PUBLIC_PREFIX)
    try:
        raw = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64 (after its whpk_ prefix)") from None
    if len(raw) != 32:
        raise ValueError(f"decodes to {len(raw)} bytes; an ed25519 public key is 32")
    return Ed25519PublicKey.from_public_bytes(raw)
