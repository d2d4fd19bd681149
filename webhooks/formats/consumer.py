"""The one normaliser of a consumer's phone or e-mail: the key suppression lists, dedupe, the
pre-ping and the field spec all compare (docs/leads.md "One consumer, one key")."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

import phonenumbers

FIELDS = ("email", "phone")  # the consumer fields a list or a buyer's dedupe may name
PHONE_REGION = "US"  # a number written without its country code, when no field spec says
# Longest value a key is made of, counted after trimming: an address is at most 254
# characters (RFC 5321), a dialled number far less. A longer one is refused, not ignored: a
# value ignored would pass every list.
MAX_VALUE = 320
# SUPPRESSION_KEY unset (webhooks/config.py): the embedded run's and the tests' key for the
# keyed hashes of plain suppression lists. It is public, so a deployment sets its own
# (docs/configuration.md): a plain list's entries are only as secret as the key.
DEFAULT_SUPPRESSION_KEY = "floodgate-development-suppression-key"


class NotAConsumerValue(ValueError):
    """A value that cannot name a consumer where one is checked (not a string, too long)."""


def key(field: str, value: Any, region: str = PHONE_REGION) -> str | None:
    """The consumer key of `value` as the lead's `field` ("email" or "phone"): None when the
    lead has none (absent, empty, not an address or number); NotAConsumerValue when it is not
    a string or is too long."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise NotAConsumerValue("must be a string")
    text = _bare(value)
    if len(text) > MAX_VALUE:
        raise NotAConsumerValue(f"must be at most {MAX_VALUE} characters")
    if not text:
        return None
    return email(text) if field == "email" else phone(text, region)


def keys_of(lead: Mapping[str, Any], fields: Iterable[str], regions: Mapping[str, str]) -> dict[str, str | None]:
    """Each of `fields` of `lead` as its key (`regions`: a phone field's region, when a field
    spec names one); NotAConsumerValue maps by field: {"phone": "must be a string"}."""
    out: dict[str, str | None] = {}
    why: dict[str, str] = {}
    for field in fields:
        try:
            out[field] = key(field, lead.get(field), regions.get(field, PHONE_REGION))
        except NotAConsumerValue as exc:
            why[field] = str(exc)
    if why:
        raise InvalidConsumerFields(why)
    return out


def stored_keys_of(lead: Mapping[str, Any], fields: Iterable[str]) -> dict[str, str | None]:
    """`keys_of` for a lead as the ledger keeps it: a value that names no consumer has no key."""
    out: dict[str, str | None] = {}
    for field in fields:
        try:
            out[field] = key(field, lead.get(field))
        except NotAConsumerValue:
            out[field] = None
    return out


class InvalidConsumerFields(ValueError):
    """Fields of a lead that cannot name a consumer, each with why."""

    def __init__(self, fields: dict[str, str]):
        super().__init__(", ".join(sorted(fields)))
        self.fields = fields


def _bare(value: str) -> str:
    """`value` without format characters (Unicode Cf: U+200B, U+FEFF, bidi marks) and the
    whitespace around it; linear in its length."""
    if not value.isascii():
        value = "".join(c for c in value if unicodedata.category(c) != "Cf")
    return value.strip()


def email(text: str) -> str | None:
    """A trimmed address as its key: lower-cased, a quoted local part unquoted, the trailing
    dot of a fully qualified domain dropped; None when it is no address (no local part or no
    domain). Syntax beyond that is the field spec's (email-validator's) to judge."""
    local, at, domain = text.rpartition("@")
    if not at:
        return None
    if len(local) >= 2 and local.startswith('"') and local.endswith('"'):
        local = _unquoted(local[1:-1])
    domain = domain.rstrip(".")
    if not local or not domain:
        return None
    return f"{local}@{domain}".lower()


def _unquoted(quoted: str) -> str:
    """The text of an RFC 5322 quoted string: each backslash escapes the character after it."""
    out, escaped = [], False
    for c in quoted:
        if escaped or c != "\\":
            out.append(c)
            escaped = False
        else:
            escaped = True
    return "".join(out)


def phone(text: str, region: str = PHONE_REGION) -> str | None:
    """A trimmed number as its key, E.164: read as `region`'s when it has no country code, an
    international prefix 00 (or the region's own, 011 in the US) read as +, an extension or a
    closing # dropped; None when it is not a possible number."""
    text = text.rstrip("#").rstrip()
    if text.startswith("00"):
        text = "+" + text[2:]
    try:
        number = phonenumbers.parse(text, region)
    except phonenumbers.NumberParseException:
        return None
    if not phonenumbers.is_possible_number(number):
        return None
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
