"""The console's forms, read into the very JSON the admin API takes: each form field names a
field of the API's object (`caps.daily` a member of `caps`), and what the form sends goes
through the API's own validation (the rules' `parse`), so a form can accept nothing the API
would refuse. A refusal names its field; the form shows the message beside that field.

A form is read as a JSON merge patch: a field the form does not send is kept, a field sent
empty is cleared (null), a checkbox is sent as a hidden empty value followed by the box's `on`
when ticked (so an unticked box is false, and a form without the box keeps the value)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from werkzeug.datastructures import MultiDict

from webhooks.errors import BadRequest, InvalidJSON, MalformedJSON, ValidationError
from webhooks.formats import strictjson

TEXT, NUMBER, CHECKBOX, LIST, JSON, SELECT, SECRET = "text", "number", "checkbox", "list", "json", "select", "secret"
MAX_FIELD = 64 * 1024  # a form field's characters: the request body's limit bounds them all
INTEGER = re.compile(r"-?[0-9]{1,18}")  # ASCII digits only: int() takes "١٢" too, isdigit() "²"


@dataclass(frozen=True)
class Field:
    name: str  # the API's field, dotted for a member of an object
    label: str
    kind: str = TEXT
    hint: str = ""
    choices: tuple[str, ...] = ()
    required: bool = False


def _value(field: Field, sent: list[str]) -> Any:
    """One field's value as the API takes it; None for an empty field (cleared)."""
    if field.kind == CHECKBOX:
        return "on" in sent
    text = (sent[-1] if sent else "").strip()
    if len(text) > MAX_FIELD:
        raise ValidationError("invalid_form", field.name, f"must be at most {MAX_FIELD} characters")
    if not text:
        return None
    if field.kind == NUMBER:
        # an integer as JSON has it; anything else goes on as text for the API's own message
        return int(text) if INTEGER.fullmatch(text) else text
    if field.kind == LIST:
        return [item for item in text.replace(",", " ").split() if item]
    if field.kind == JSON:
        # the API's own parser: duplicate keys, NaN and nesting past its depth refused alike
        try:
            return strictjson.loads(text.encode("utf-8", "surrogatepass"))
        except MalformedJSON as exc:
            where = str(exc).rpartition("JSON: ")[2]  # the parser's "Expecting value: line 1 column 1"
            raise ValidationError("invalid_form", field.name, f"is not JSON: {where}") from None
        except InvalidJSON as exc:
            raise ValidationError("invalid_form", field.name, f"is refused: {exc}") from None
    return text


def read(fields: tuple[Field, ...], form: MultiDict[str, str]) -> dict[str, Any]:
    """The form as a JSON merge patch of the API's object: the fields it sends, members of an
    object gathered under it, an emptied field as null."""
    body: dict[str, Any] = {}
    for field in fields:
        if field.name not in form:
            continue
        value = _value(field, form.getlist(field.name))
        head, _, member = field.name.partition(".")
        if member:
            body.setdefault(head, {})[member] = value
        else:
            body[field.name] = value
    return body


def shown(fields: tuple[Field, ...], obj: Mapping[str, Any]) -> dict[str, str]:
    """What each field of a form shows for the API's object `obj` (as its GET gives it)."""
    values: dict[str, str] = {}
    for field in fields:
        head, _, member = field.name.partition(".")
        value = obj.get(head)
        if member:
            value = value.get(member) if isinstance(value, dict) else None
        if field.kind == CHECKBOX:
            values[field.name] = "on" if value else ""
        elif value is None or field.kind == SECRET:
            values[field.name] = ""
        elif field.kind == LIST:
            values[field.name] = ", ".join(str(item) for item in value)
        elif field.kind == JSON:
            values[field.name] = json.dumps(value, indent=1, sort_keys=True)
        else:
            values[field.name] = str(value)
    return values


def refilled(fields: tuple[Field, ...], form: MultiDict[str, str]) -> dict[str, str]:
    """The values a refused form is shown again with: what the operator typed, but a secret."""
    values = {}
    for f in fields:
        if f.kind == CHECKBOX:
            values[f.name] = "on" if "on" in form.getlist(f.name) else ""
        else:
            values[f.name] = "" if f.kind == SECRET else form.get(f.name, "")
    return values


def errors_of(fields: tuple[Field, ...], exc: BadRequest) -> dict[str, str]:
    """A refusal as the form shows it: by the field it names, or the nearest one holding it
    (`delivery.headers.X-Key` is the `delivery` field's), else under `_form` (above the form)."""
    named = exc.field if isinstance(exc, ValidationError) else ""
    names = {f.name for f in fields}
    while named:
        if named in names:
            return {named: str(exc).split(": ", 1)[-1]}
        named = named.rpartition(".")[0]
    return {"_form": str(exc)}
