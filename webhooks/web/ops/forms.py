"""The console's forms, read into the very JSON the admin API takes: each form field names a
field of the API's object (`caps.daily` a member of `caps`), and what the form sends goes
through the API's own validation (the rules' `parse`), so a form can accept nothing the API
would refuse. Every refusal names its field: a form shows them all at once, listed above it
and each beside its field (docs/operations.md "Forms").

A form is read as a JSON merge patch: a field the form does not send is kept, a field sent
empty is cleared (null), a checkbox is sent as a hidden empty value followed by the box's `on`
when ticked (so an unticked box is false, and a form without the box keeps the value). An
object whose members the form sends all empty is cleared, as is one whose `clears` member is
empty (no billing mode: not billed)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, TypeVar

from werkzeug.datastructures import MultiDict

from webhooks.errors import BadRequest, InvalidJSON, MalformedJSON, ValidationError, ValidationErrors
from webhooks.formats import strictjson
from webhooks.logs import SECRET_SHOWN_PREFIX

TEXT, NUMBER, CHECKBOX, LIST, JSON, SELECT, SECRET = "text", "number", "checkbox", "list", "json", "select", "secret"
HOURS, HEADERS, CHOICES = "hours", "headers", "choices"
SECRETS = (SECRET, HEADERS)  # never written back into a page as typed
MAX_FIELD = 64 * 1024  # a form field's characters: the request body's limit bounds them all
INTEGER = re.compile(r"-?[0-9]{1,18}")  # ASCII digits only: int() takes "١٢" too, isdigit() "²"
HEADER_LINE = re.compile(r"([^:\s][^:]*):(.*)")
CLOSED = "closed"  # an HOURS field's word for a day listed with no hours
RETYPE = "not shown back (a secret): type it again"
T = TypeVar("T")
FORM = "_form"  # the errors' key of a refusal no field holds, shown above the form


@dataclass(frozen=True)
class Field:
    name: str  # the API's field, dotted for a member of an object
    label: str
    kind: str = TEXT
    _: KW_ONLY
    hint: str = ""
    choices: tuple[str, ...] = ()
    blank: str = ""  # a SELECT's empty choice, by this label (none: a choice is always sent)
    required: bool = False
    clears: bool = False  # this member empty clears its whole object (the billing mode)
    section: str = ""  # a heading shown above the field, opening a group of fields

    @property
    def id(self) -> str:
        """The HTML id of its input, which the list of errors above the form links to."""
        return "f-" + self.name.replace(".", "-")


@dataclass(frozen=True, kw_only=True)
class Reading:
    """A form as read: its merge patch, and each field it could not read (by name: why)."""

    body: dict[str, Any]
    errors: dict[str, str] = field(default_factory=dict)


def _text(f: Field, sent: list[str]) -> str:
    text = (sent[-1] if sent else "").strip()
    if len(text) > MAX_FIELD:
        raise ValidationError("invalid_form", f.name, f"must be at most {MAX_FIELD} characters")
    return text


def _value(f: Field, sent: list[str]) -> Any:
    """One field's value as the API takes it; None for an empty field (cleared)."""
    if f.kind == CHECKBOX:
        return "on" in sent
    if f.kind == CHOICES:
        picked = [value for value in sent if value]
        if not set(picked) <= set(f.choices):
            raise ValidationError("invalid_form", f.name, "must be among " + ", ".join(f.choices))
        return list(dict.fromkeys(picked)) or None
    text = _text(f, sent)
    return _typed(f, text) if text else None


def _typed(f: Field, text: str) -> Any:
    """A field's text, not empty, as the API takes it."""
    if f.kind == NUMBER:
        # an integer as JSON has it; anything else goes on as text for the API's own message
        return int(text) if INTEGER.fullmatch(text) else text
    if f.kind == LIST:
        return [item for item in text.replace(",", " ").split() if item]
    if f.kind == HOURS:
        return _hours(f, text)
    if f.kind == HEADERS:
        return _headers(f, text)
    if f.kind == JSON:
        # the API's own parser: duplicate keys, NaN and nesting past its depth refused alike
        try:
            return strictjson.loads(text.encode("utf-8", "surrogatepass"))
        except MalformedJSON as exc:
            where = str(exc).rpartition("JSON: ")[2]  # the parser's "Expecting value: line 1 column 1"
            raise ValidationError("invalid_form", f.name, f"is not JSON: {where}") from None
        except InvalidJSON as exc:
            raise ValidationError("invalid_form", f.name, f"is refused: {exc}") from None
    return text


def _hours(f: Field, text: str) -> list[list[str]]:
    """`09:00-12:00, 13:00-17:00` as the API's [start, end] pairs; `closed`: none. The times
    themselves are the API's to check."""
    if text.lower() == CLOSED:
        return []
    pairs = []
    for item in text.split(","):
        start, dash, end = item.replace("–", "-").partition("-")
        if not dash or not start.strip() or not end.strip():
            raise ValidationError(
                "invalid_form", f.name, f"{item.strip()[:20]!r} is not hours such as 09:00-17:00 (or {CLOSED})"
            )
        pairs.append([start.strip(), end.strip()])
    return pairs


def _headers(f: Field, text: str) -> dict[str, str]:
    """Lines `Name: value` as the API's object of headers (the API checks names and values)."""
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        found = HEADER_LINE.fullmatch(line.strip())
        if not found:  # the line is not quoted back: it may hold the secret
            raise ValidationError("invalid_form", f.name, f"line {number} is not Name: value")
        name = found.group(1).strip()
        if name in headers:
            raise ValidationError("invalid_form", f.name, f"names {name[:30]!r} twice")
        headers[name] = found.group(2).strip()
    return headers


def read(fields: tuple[Field, ...], form: MultiDict[str, str], current: Mapping[str, Any] | None = None) -> Reading:
    """The form as a JSON merge patch of the API's object `current` (as its GET shows it; none
    for a new one): the fields it sends, members of an object gathered under it, an emptied
    field as null; a JSON or headers field replaces its object whole (a member it no longer
    names is removed). A field it cannot read is left out, and named in the errors."""
    body: dict[str, Any] = {}
    errors: dict[str, str] = {}
    cleared: set[str] = set()
    for f in fields:
        if f.name not in form:
            continue
        try:
            value = _value(f, form.getlist(f.name))
        except ValidationError as exc:
            errors[f.name] = exc.problem
            continue
        if value is None and f.required:
            errors[f.name] = "is required"
            continue
        head, _, member = f.name.partition(".")
        if isinstance(value, dict):
            value = _replacing(_member(current or {}, f.name), value)
        if not member:
            body[f.name] = value
            continue
        body.setdefault(head, {})[member] = value
        if value is None and f.clears:
            cleared.add(head)
    for head, members in body.items():
        if isinstance(members, dict) and (head in cleared or all(m is None for m in members.values())):
            body[head] = None
    return Reading(body=body, errors=errors)


def _member(obj: Mapping[str, Any], name: str) -> Any:
    head, _, member = name.partition(".")
    value = obj.get(head)
    if member:
        value = value.get(member) if isinstance(value, dict) else None
    return value


def _replacing(old: Any, new: Any) -> Any:
    """A merge patch member that makes `old` exactly `new`: RFC 7396 merges objects member by
    member, so each member of `old` that `new` lacks is named null."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    gone = {name: None for name in old if name not in new}
    return {**gone, **{name: _replacing(old.get(name), value) for name, value in new.items()}}


def shown(fields: tuple[Field, ...], obj: Mapping[str, Any]) -> dict[str, str]:
    """What each field of a form shows for the API's object `obj` (as its GET gives it)."""
    values: dict[str, str] = {}
    for f in fields:
        value = _member(obj, f.name)
        if f.kind == CHECKBOX:
            values[f.name] = "on" if value else ""
        elif value is None or f.kind == SECRET:
            values[f.name] = ""
        elif f.kind in (LIST, CHOICES):
            values[f.name] = ", ".join(str(item) for item in value)
        elif f.kind == HOURS:
            values[f.name] = ", ".join(f"{start}-{end}" for start, end in value) or CLOSED
        elif f.kind == HEADERS:
            values[f.name] = "\n".join(f"{name}: {text}" for name, text in value.items())
        elif f.kind == JSON:
            values[f.name] = json.dumps(value, indent=1, sort_keys=True)
        else:
            values[f.name] = str(value)
    return values


def refilled(
    fields: tuple[Field, ...], form: MultiDict[str, str], current: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The values a refused form is shown again with: what the operator typed, but a secret,
    which shows what it showed before (the stored one `current` has, redacted; else nothing)."""
    before = shown(fields, current or {})
    values = {}
    for f in fields:
        if f.kind == CHECKBOX:
            values[f.name] = "on" if "on" in form.getlist(f.name) else ""
        elif f.kind == CHOICES:
            values[f.name] = ", ".join(value for value in form.getlist(f.name) if value in f.choices)
        elif f.kind in SECRETS:
            values[f.name] = before[f.name]
        else:
            values[f.name] = form.get(f.name, "")
    return values


def checked(
    fields: tuple[Field, ...], form: MultiDict[str, str], reading: Reading, validate: Callable[[], T]
) -> tuple[T | None, dict[str, str]]:
    """What `validate` (the API's own check of the form's patch) answers, and every refusal of
    the form: the fields it could not read and each the API refuses. The answer is None when
    there is any."""
    try:
        answer: T | None = validate()
        refused = None
    except BadRequest as exc:
        answer, refused = None, exc
    errors = refusals(fields, form, reading, refused)
    return (None if errors else answer), errors


def refusals(
    fields: tuple[Field, ...], form: MultiDict[str, str], reading: Reading, exc: BadRequest | None
) -> dict[str, str]:
    """Every refusal of a form, by the field it names: those it could not read, then the API's
    (ValidationErrors: each of them) on the field holding them, one message a field; a secret
    typed anew but not kept, to be typed again (shown empty or as stored)."""
    errors = dict(reading.errors)
    found = exc.errors if isinstance(exc, ValidationErrors) else (exc,) if exc is not None else ()
    for error in found:
        name = _holder(fields, error.field if isinstance(error, ValidationError) else "")
        text = error.problem if isinstance(error, ValidationError) and name != FORM else str(error)
        errors.setdefault(name, text)
    if errors:
        for f in fields:
            typed = form.get(f.name, "").strip()
            if f.kind in SECRETS and typed and f.name not in errors and _is_new_secret(f, typed):
                errors[f.name] = RETYPE
    return errors


def _is_new_secret(f: Field, typed: str) -> bool:
    """A secret field holds something beyond the redacted values (****1234) a GET shows."""
    if f.kind == SECRET:
        return True
    values = (line.partition(":")[2].strip() for line in typed.splitlines() if line.strip())
    return any(not value.startswith(SECRET_SHOWN_PREFIX) for value in values)


def _holder(fields: tuple[Field, ...], named: str) -> str:
    """The field a refusal of `named` is shown beside: that one, or the nearest holding it
    (`delivery.headers.X-Key` is the `delivery.headers` field's, `schedule.mon[0]` the
    `schedule.mon` field's), or the first member of an object named whole (`billing`); else
    above the form."""
    names = [f.name for f in fields]
    while named:
        if named in names:
            return named
        members = [name for name in names if name.startswith(named + ".")]
        if members:
            return members[0]
        named = named.rpartition("[")[0] if named.endswith("]") else named.rpartition(".")[0]
    return FORM
