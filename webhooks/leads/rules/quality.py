"""A publisher's lead spec (docs/api.md "Publishers: limits, quality, test mode and payouts",
`fields`): each declared field typed, bounded and normalised before a lead is claimed or
routed, so that buyers, templates, filters and dedupe see one form of it and nobody pays for
junk. E-mail syntax is email-validator's, phone numbers are phonenumbers' (Google's
libphonenumber): well-kept libraries, not our own patterns. Undeclared fields pass through.

`parse_spec` checks the admin's spec when the publisher is saved; `FieldSpec.apply` checks a
lead against it and returns the normalised lead, or raises InvalidLead naming every failing
field. Each check is linear in its value, and every value is bounded before a library sees it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import phonenumbers
from email_validator import EmailNotValidError, validate_email

from webhooks.errors import InvalidLead, ValidationError
from webhooks.formats import consumer, us_states
from webhooks.formats.validate import is_id
from webhooks.leads.rules import consent

CODE = "invalid_publisher"
STATE_FIELD = "state"  # the lead field buyers' `states` filter on
TYPES = (
    "string",
    "email",
    "phone",
    "postal_code",
    "integer",
    "number",
    "enum",
    "boolean",
    consent.CERT_FIELD,
    consent.LEADID_FIELD,
)
OPTIONS = {
    "string": {"max_length"},
    "email": set(),
    "phone": {"region"},
    "postal_code": set(),
    "integer": {"min", "max"},
    "number": {"min", "max"},
    "enum": {"values"},
    "boolean": set(),
    consent.CERT_FIELD: set(),
    consent.LEADID_FIELD: set(),
}
MAX_FIELDS = 100
MAX_STRING = 10_000  # the longest max_length (and a string field's length without one)
MAX_ENUM_VALUES = 200
MAX_EMAIL = 254  # RFC 5321's path limit, less the brackets
MAX_LOCAL = 64  # RFC 5321 4.5.3.1.1: octets of the part before the @
MAX_DOMAIN = 253  # RFC 1035, in its ASCII (IDNA) form, without the root's dot
MAX_LABEL = 63  # RFC 1035, each label in its ASCII form
# What email-validator's checks of one lead may cost, in characters of its domains: ~2.6 µs
# each (an internationalised one ~7 times that: the IDNA codec), ~65 µs per address besides.
# 100 short addresses fit; past it the lead's other e-mail fields are refused unchecked, so a
# lead costs ~10 ms of checks at most, however many e-mail fields its spec declares.
MAX_EMAIL_WORK = 4096
EMAIL_BASE_WORK, IDN_WEIGHT = 25, 7
MAX_PHONE = 64  # far above any dialled form; phonenumbers itself stops at 250
MAX_NUMBER_TEXT = 40
ZIP = re.compile(r"[0-9]{5}(?:-[0-9]{4})?")  # fullmatch: `$` would pass a trailing newline
NUMBER = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?")  # ASCII digits only: no `_`, exponent or other script
TRUE, FALSE = {"true", "yes", "1"}, {"false", "no", "0"}


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    required: bool = False
    max_length: int = MAX_STRING
    region: str = "US"
    low: Decimal | None = None
    high: Decimal | None = None
    values: tuple[str, ...] = ()

    def normalise(self, value: Any) -> Any:
        """`value` in its stored form, or ValueError saying why not."""
        return _NORMALISERS[self.type](self, value)


@dataclass(frozen=True)
class FieldSpec:
    fields: tuple[Field, ...]

    def apply(self, lead: dict[str, Any]) -> dict[str, Any]:
        """The lead with every declared field normalised; InvalidLead naming each field that
        breaks the spec (a missing required one, a value of the wrong type or out of bounds)."""
        out = dict(lead)
        why: dict[str, str] = {}
        email_work = 0
        for f in self.fields:
            value = lead.get(f.name)
            if value is None or value == "":
                if f.required:
                    why[f.name] = "is required"
                continue
            if f.type == "email":
                email_work += _email_work(value)
                if email_work > MAX_EMAIL_WORK:
                    why[f.name] = "must be an e-mail address (the lead's e-mail fields are too long to check)"
                    continue
            try:
                out[f.name] = f.normalise(value)
            except ValueError as exc:
                why[f.name] = str(exc)
        if why:
            names = ", ".join(sorted(why))
            raise InvalidLead(f"the lead breaks the publisher's field spec: {names}", fields=why)
        return out

    def to_json(self) -> dict[str, Any]:
        return {f.name: _field_json(f) for f in self.fields}

    def regions(self) -> dict[str, str]:
        """The region each phone field is read in (a number without its country code)."""
        return {f.name: f.region for f in self.fields if f.type == "phone"}

    def consent_fields(self) -> consent.Fields:
        """The fields that carry a TrustedForm certificate and a LeadiD token (the first of each type)."""

        def first(kind: str) -> str | None:
            return next((f.name for f in self.fields if f.type == kind), None)

        return consent.Fields(cert=first(consent.CERT_FIELD), leadid=first(consent.LEADID_FIELD))


def checked(spec: FieldSpec | None, lead_id: str, lead: dict[str, Any], payload: str) -> tuple[dict[str, Any], str]:
    """(lead, payload) as the lead path carries them: with a spec, the normalised lead and its
    JSON (what the ledger keeps and a re-offer posts, so a buyer sees one form of the lead
    however it reaches it); without one, as they came. InvalidLead when the lead breaks it."""
    if spec is None:
        return lead, payload
    normal = spec.apply(lead)
    return normal, json.dumps({"lead_id": lead_id, **normal}, separators=(",", ":"), ensure_ascii=False)


def _field_json(f: Field) -> dict[str, Any]:
    out: dict[str, Any] = {"type": f.type}
    if f.required:
        out["required"] = True
    if f.type == "string" and f.max_length != MAX_STRING:
        out["max_length"] = f.max_length
    if f.type == "phone":
        out["region"] = f.region
    if f.type in ("integer", "number"):
        for key, bound in (("min", f.low), ("max", f.high)):
            if bound is not None:
                out[key] = int(bound) if f.type == "integer" else _plain(bound)
    if f.type == "enum":
        out["values"] = list(f.values)
    return out


def _plain(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


# --- the admin's spec ----------------------------------------------------------------------


def parse_spec(raw: Any, *, check_states: bool = True) -> FieldSpec | None:
    """Validate a publisher's `fields` (None or {} : no spec); ValidationError naming the field.
    `check_states` False: a spec as stored, whose `state` enum may predate the check that its
    values are US state codes (written earlier), read as it is so loading it never fails."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValidationError(CODE, "fields", 'must be an object {"<field>": {"type": ...}}')
    if len(raw) > MAX_FIELDS:
        raise ValidationError(CODE, "fields", f"at most {MAX_FIELDS} fields")
    if "lead_id" in raw or "test" in raw:
        raise ValidationError(CODE, "fields", "lead_id and test are not lead fields a spec may declare")
    found = tuple(_field(name, rule, check_states) for name, rule in raw.items())
    return FieldSpec(found) if found else None


def _field(name: Any, rule: Any, check_states: bool) -> Field:
    where = f"fields.{name}"
    if not is_id(name):
        raise ValidationError(CODE, "fields", f"{str(name)[:70]!r}: a field name must match [A-Za-z0-9._-]{{1,64}}")
    if not isinstance(rule, dict) or rule.get("type") not in TYPES:
        raise ValidationError(CODE, f"{where}.type", "must be one of " + ", ".join(TYPES))
    kind = rule["type"]
    for key in rule:
        if key not in ("type", "required") and key not in OPTIONS[kind]:
            allowed = ", ".join(sorted(OPTIONS[kind] | {"required"}))
            raise ValidationError(CODE, f"{where}.{str(key)[:64]}", f"unknown option for {kind}; use {allowed}")
    required = rule.get("required", False)
    if not isinstance(required, bool):
        raise ValidationError(CODE, f"{where}.required", "must be true or false")
    return _typed(Field(name, kind, required), rule, where, check_states)


def _typed(field: Field, rule: dict[str, Any], where: str, check_states: bool) -> Field:
    """`field` with the options of its type read from `rule`."""
    name, kind, required = field.name, field.type, field.required
    if kind == "string":
        longest = _count(rule.get("max_length", MAX_STRING), f"{where}.max_length")
        field = Field(name, kind, required, max_length=longest)
    elif kind == "phone":
        region = rule.get("region", "US")
        if not isinstance(region, str) or region.upper() not in phonenumbers.SUPPORTED_REGIONS:
            raise ValidationError(CODE, f"{where}.region", "must be a two-letter region phonenumbers knows, e.g. US")
        field = Field(name, kind, required, region=region.upper())
    elif kind in ("integer", "number"):
        low, high = (_bound(rule.get(k), f"{where}.{k}", kind) for k in ("min", "max"))
        if low is not None and high is not None and low > high:
            raise ValidationError(CODE, f"{where}.min", "must not be above max")
        field = Field(name, kind, required, low=low, high=high)
    elif kind == "enum":
        values = _values(rule.get("values"), f"{where}.values")
        if name == STATE_FIELD and check_states:
            values = _state_codes(values, f"{where}.values")
        field = Field(name, kind, required, values=values)
    return field


def _state_codes(values: tuple[str, ...], where: str) -> tuple[str, ...]:
    """The values of an enum of the lead's `state`: US state codes, as buyers' `states` hold
    them, so a lead the spec lets in reaches the buyers of its state (upper-cased, once each)."""
    unknown = [value for value in values if us_states.code(value) is None]
    if unknown:
        listed = ", ".join(repr(value[:16]) for value in unknown[:5])
        raise ValidationError(CODE, where, f"{listed}: not a US state or territory code (two letters, e.g. TX)")
    return tuple(dict.fromkeys(value.strip().upper() for value in values))


def state_values(raw: Any) -> list[str] | None:
    """The values of the `state` enum of a spec as sent or stored (upper-cased, sorted), None
    when it has none: the same values as the stored spec are kept without the state check."""
    rule = raw.get(STATE_FIELD) if isinstance(raw, dict) else None
    values = rule.get("values") if isinstance(rule, dict) and rule.get("type") == "enum" else None
    if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
        return None
    return sorted(x.strip().upper() for x in values)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_STRING:
        raise ValidationError(CODE, where, f"must be a whole number from 1 to {MAX_STRING}")
    return value


def _bound(value: Any, where: str, kind: str) -> Decimal | None:
    if value is None:
        return None
    ok = isinstance(value, int) if kind == "integer" else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or abs(value) > 10**15:
        raise ValidationError(CODE, where, f"must be {'a whole number' if kind == 'integer' else 'a number'}")
    return Decimal(str(value))


def _values(value: Any, where: str) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_ENUM_VALUES
        or not all(isinstance(x, str) and 1 <= len(x) <= 100 for x in value)
    ):
        raise ValidationError(CODE, where, f"must list 1 to {MAX_ENUM_VALUES} strings of 1 to 100 characters")
    if len({x.casefold() for x in value}) != len(value):
        raise ValidationError(CODE, where, "lists a value twice (values are case-insensitive)")
    return tuple(value)


# --- a lead's values -------------------------------------------------------------------------


def _string(f: Field, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    text = value.strip()
    if len(text) > f.max_length:
        raise ValueError(f"must be at most {f.max_length} characters")
    return text


def _email(_f: Field, value: Any) -> str:
    """The address as its consumer key (webhooks/formats/consumer.py), once email-validator passes it."""
    if not isinstance(value, str) or len(value) > MAX_EMAIL + 64:
        raise ValueError("must be an e-mail address")
    text = consumer.key("email", value) or value.strip()  # no key: the library says why not
    if not text or len(text) > MAX_EMAIL or not _email_shape(text):
        raise ValueError("must be an e-mail address")
    try:
        validate_email(text, check_deliverability=False)  # syntax only: no DNS on the lead path
    except EmailNotValidError as exc:
        raise ValueError(f"is not a valid e-mail address ({exc})") from None
    return text


def _email_shape(text: str) -> bool:
    """Whether `text` can be an address by the RFC's length and label limits, checked in one
    pass before email-validator runs: its IDNA codec costs ~18 µs per character of an
    internationalised domain, and a domain of long internationalised labels would cost
    milliseconds per field only to be refused. Each bound is one the address's ASCII form must meet anyway (a non-ASCII
    label becomes `xn--` and at least one character per character)."""
    local, at, domain = text.rpartition("@")
    if not at:
        return True  # the library says why, cheaply
    if len(local.encode()) > MAX_LOCAL:
        return False
    ascii_length = len(domain)
    for label in domain.split("."):
        if len(label) > MAX_LABEL:
            return False
        if not label.isascii():
            ascii_length += 4
    return ascii_length <= MAX_DOMAIN


def _email_work(value: Any) -> int:
    """What checking `value` as an address costs email-validator, in MAX_EMAIL_WORK's units."""
    if not isinstance(value, str):
        return 0
    domain = value[value.rfind("@") + 1 :] if len(value) <= MAX_EMAIL + 64 else ""
    return EMAIL_BASE_WORK + len(domain) * (1 if domain.isascii() else IDN_WEIGHT)


def _phone(f: Field, value: Any) -> str:
    """The number as its consumer key (webhooks/formats/consumer.py): E.164, read as `f.region`'s."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # a number sent as a JSON number: the spec reads it as its digits
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_PHONE:
        raise ValueError("must be a phone number")
    number = consumer.key("phone", value, f.region)
    if number is None:
        raise ValueError(f"is not a possible phone number (region {f.region})")
    return number


def _postal_code(_f: Field, value: Any) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if not ZIP.fullmatch(text):
        raise ValueError("must be a US ZIP code (12345) or ZIP+4 (12345-6789)")
    return text


def _decimal(value: Any) -> Decimal:
    if isinstance(value, bool):
        raise ValueError("must be a number")
    if isinstance(value, (int, Decimal)):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    text = value.strip() if isinstance(value, str) and len(value) <= MAX_NUMBER_TEXT else ""
    if not NUMBER.fullmatch(text):
        raise ValueError("must be a number (digits, an optional sign and fraction)")
    try:
        return Decimal(text)
    except InvalidOperation:  # not reachable after the pattern; kept so no input can raise
        raise ValueError("must be a number") from None


def _within(f: Field, number: Decimal) -> None:
    if not number.is_finite() or abs(number) > 10**15:
        raise ValueError("must be a finite number")
    if f.low is not None and number < f.low:
        raise ValueError(f"must be at least {_plain(f.low)}")
    if f.high is not None and number > f.high:
        raise ValueError(f"must be at most {_plain(f.high)}")


def _integer(f: Field, value: Any) -> int:
    number = _decimal(value)
    if not number.is_finite() or number != number.to_integral_value():
        raise ValueError("must be a whole number")
    _within(f, number)
    return int(number)


def _number(f: Field, value: Any) -> int | float:
    number = _decimal(value)
    _within(f, number)
    return _plain(number)


def _enum(f: Field, value: Any) -> str:
    if isinstance(value, str) and len(value) <= 100:
        wanted = value.strip().casefold()
        for listed in f.values:
            if listed.casefold() == wanted:
                return listed
    shown = ", ".join(f.values[:10]) + (", ..." if len(f.values) > 10 else "")
    raise ValueError(f"must be one of {shown}")


def _boolean(_f: Field, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = value.strip().lower() if isinstance(value, str) and len(value) <= 8 else ""
    if text in TRUE or text in FALSE:
        return text in TRUE
    raise ValueError("must be true or false")


_NORMALISERS: dict[str, Callable[[Field, Any], Any]] = {
    "string": _string,
    "email": _email,
    "phone": _phone,
    "postal_code": _postal_code,
    "integer": _integer,
    "number": _number,
    "enum": _enum,
    "boolean": _boolean,
    consent.CERT_FIELD: lambda _f, value: consent.cert_url(value),
    consent.LEADID_FIELD: lambda _f, value: consent.leadid(value),
}
