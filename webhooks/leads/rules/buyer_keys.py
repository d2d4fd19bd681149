"""Buyer API keys (docs/buyers.md "The buyer API"): issued by an operator, shown once, and
checked on every buyer API request.

A key is `bk_` and 32 random bytes (base64url, 43 characters): the prefix tells an operator,
and a secret scanner, what a leaked string is. Only its SHA-256 is stored. A slow password
hash (argon2, bcrypt) is for secrets people choose, which can be guessed a few million at a
time; a key of 256 random bits cannot be guessed at any speed, so a fast hash loses nothing,
and being unsalted it is the key's own index: a presented key is found by one lookup of the
unique `api_key_hash`, never by reading every buyer. A new key replaces the hash, so the old
key stops working with that commit."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

from webhooks.errors import NotFound
from webhooks.storage.records import audit
from webhooks.storage.records.db import db, is_mysql
from webhooks.storage.records.models import Buyer

PREFIX = "bk_"
# What `issue` makes: the prefix, then 32 bytes in unpadded base64url. Anything else presented
# is no key of ours and costs no database read.
KEY_RE = re.compile(r"bk_[A-Za-z0-9_-]{43}")


def key_hash(api_key: str) -> str:
    """What is stored of a key: the hex SHA-256 of it."""
    return hashlib.sha256(api_key.encode()).hexdigest()


def new_key() -> str:
    return PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def issue(buyer_id: str, actor: str = "admin") -> str:
    """A new key for the buyer (not deleted; NotFound otherwise), replacing any it had, and an
    audit row saying so (never the key, nor its hash). The key is returned once: it cannot be
    read back."""
    key = new_key()
    with db.atomic():
        row = Buyer.select(Buyer.id, Buyer.api_key_hash).where(Buyer.id == buyer_id, Buyer.deleted_at.is_null())
        # locked: of two rotations at once, the audit row of the second names the first's key
        stored = (row.for_update() if is_mysql() else row).first()
        if stored is None:
            raise NotFound(f"no buyer {buyer_id!r}")
        Buyer.update(api_key_hash=key_hash(key)).where(Buyer.id == buyer_id).execute()
        action = "buyer.api_key_rotated" if stored.api_key_hash else "buyer.api_key_issued"
        audit.record(actor, action, "buyer", buyer_id, {"prefix": PREFIX})
    return key


def holder(presented: str) -> Buyer | None:
    """The buyer whose current key `presented` is, whatever its state (the caller refuses an
    inactive or deleted one); None for any other string. The index finds the row by the hash;
    the hashes are compared again in constant time, so that no answer depends on how much of a
    wrong hash matched (the database's comparison makes no such promise)."""
    if KEY_RE.fullmatch(presented) is None:
        return None
    wanted = key_hash(presented)
    row = Buyer.get_or_none(Buyer.api_key_hash == wanted)
    if row is None or not hmac.compare_digest(str(row.api_key_hash), wanted):
        return None
    return row
