"""Buyer integrations (API.md "Buyer integrations"): how a buyer wants its post and its ping
built, and how its reply is judged.

Everything is compiled once, when the buyer is saved (and again when the config cache
reloads): Jinja2 templates in the sandbox, JMESPath expressions, regular expressions. A
template the sandbox forbids is found at save time by rendering it with a sample lead, since
the sandbox only refuses an unsafe attribute when it is used. At delivery a template only
renders; a missing lead field renders empty (JSON: null), and a render that still fails
yields an empty value rather than an error in the publisher's request.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlencode

import jmespath
import jmespath.exceptions
from jinja2 import ChainableUndefined, TemplateError, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from webhooks.errors import ValidationError

log = logging.getLogger(__name__)

CODE = "invalid_buyer"
DEFAULT_ACCEPT = "accepted == `true`"
_WHOLE_EXPR = re.compile(r"^\s*\{\{(.*)\}\}\s*$", re.S)
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_RESERVED_HEADERS = {"content-type", "content-length", "host", "idempotency-key", "transfer-encoding", "connection"}
REDACTED_PREFIX = "****"

class _Undefined(ChainableUndefined):
    """A missing value chains (`ping.bid_id` when there is no ping) and renders as "". What the
    sandbox refused (an unsafe attribute) raises SecurityError when used, chained or not:
    plain chaining would hide `''.__class__.__mro__` behind an empty string."""

    def _refused(self) -> bool:
        return self._undefined_exception is SecurityError

    def __getattr__(self, name: str):
        if self._refused() and not name.startswith("_undefined"):
            self._fail_with_undefined_error()
        return super().__getattr__(name)

    def __getitem__(self, key):
        if self._refused():
            self._fail_with_undefined_error()
        return super().__getitem__(key)

    def __str__(self) -> str:
        if self._refused():
            self._fail_with_undefined_error()
        return super().__str__()


# Immutable: a template may not change the lead it is given (`lead.pop(...)`), which the routing
# of the next buyers (their dedupe keys) still reads.
ENV = ImmutableSandboxedEnvironment(undefined=_Undefined, autoescape=False)

SAMPLE = {"lead": {"first_name": "Ada", "last_name": "Lovelace", "email": "ada@example.com",
                   "phone": "+15125550100", "state": "TX", "zip": "73301"},
          "lead_id": "sample-lead", "publisher_id": "sample-publisher", "buyer_id": "sample-buyer",
          "price": "10.00", "ping": {"bid": "9.50", "bid_id": "sample-bid"}}


class _Field:
    """One output field: a template, or a single `{{ expr }}` whose value keeps its type."""

    def __init__(self, name: str, source: str, where: str):
        self.name = name
        try:
            whole = _WHOLE_EXPR.match(source)
            self.expr = (ENV.compile_expression(whole.group(1), undefined_to_none=False)
                         if whole and "{{" not in whole.group(1) else None)
            self.template = None if self.expr else ENV.from_string(source)
        except TemplateError as exc:
            raise ValidationError(CODE, where, f"is not a valid template: {exc}") from None

    def value(self, context: dict, native: bool) -> Any:
        if self.expr is not None:
            result = self.expr(**context)
            if isinstance(result, Undefined):
                if result._undefined_exception is SecurityError:
                    raise SecurityError(str(result._undefined_message))
                return None if native else ""
            if native:
                return result if isinstance(result, (str, int, float, bool, list, dict)) or result is None \
                    else str(result)
            return "" if result is None else str(result)
        return self.template.render(**context)


def _compile_fields(raw: Any, where: str) -> list[_Field]:
    if not isinstance(raw, dict) or not raw:
        raise ValidationError(CODE, where, "must be an object of output name -> template")
    out = []
    for name, source in raw.items():
        if not isinstance(name, str) or not 0 < len(name) <= 128:
            raise ValidationError(CODE, where, "output names must be strings of 1 to 128 characters")
        if not isinstance(source, str) or len(source) > 4096:
            raise ValidationError(CODE, f"{where}.{name}", "must be a template string (at most 4096 characters)")
        out.append(_Field(name, source, f"{where}.{name}"))
    return out


def _try_render(fields: list[_Field], where: str, native: bool) -> None:
    """Render with the sample lead, and encode the result as a post would: the sandbox
    refuses unsafe attributes only when they are used (`{{ [''.__class__] }}` only when the
    list is encoded)."""
    for f in fields:
        try:
            value = f.value(SAMPLE, native)
            json.dumps(value, default=str) if native else urlencode({f.name: value})
        except Exception as exc:  # SecurityError, or any other failure of this template
            raise ValidationError(CODE, f"{where}.{f.name}", f"cannot be rendered: {exc}") from None


def _jmespath(raw: Any, where: str):
    if not isinstance(raw, str) or not raw or len(raw) > 1024:
        raise ValidationError(CODE, where, "must be a JMESPath expression")
    try:
        return jmespath.compile(raw)
    except jmespath.exceptions.JMESPathError as exc:
        raise ValidationError(CODE, where, f"is not a valid JMESPath expression: {exc}") from None


def redact(value: str) -> str:
    """A header value as GET shows it: only its last 4 characters."""
    return REDACTED_PREFIX + value[-4:]


@dataclass(frozen=True)
class Delivery:
    """A buyer's post: how it is built and how its reply is judged."""

    method: str = "POST"
    format: str = "json"
    headers: tuple[tuple[str, str], ...] = ()
    fields: tuple[_Field, ...] | None = None  # None: the default contract body
    accept: Any = None  # compiled JMESPath (None with accept_regex)
    accept_regex: re.Pattern | None = None

    @property
    def content_type(self) -> str:
        return "application/json" if self.format == "json" else "application/x-www-form-urlencoded"

    def body(self, context: dict, default: bytes) -> bytes:
        """The post's body for `context` (lead, lead_id, publisher_id, buyer_id, price, ping)."""
        if self.fields is None:
            return default
        native = self.format == "json"
        values = {}
        for f in self.fields:
            try:
                values[f.name] = f.value(context, native)
            except Exception as exc:  # never into the publisher's request
                log.warning("template %s of buyer %s failed: %s", f.name, context.get("buyer_id"), exc)
                values[f.name] = None if native else ""
        try:
            if native:
                return json.dumps(values, separators=(",", ":"), default=str).encode()
            return urlencode(values).encode()
        except Exception as exc:  # never into the publisher's request
            log.warning("post of buyer %s could not be encoded: %s", context.get("buyer_id"), exc)
            empty = {f.name: None if native else "" for f in self.fields}
            return json.dumps(empty).encode() if native else urlencode(empty).encode()

    def accepted(self, content: bytes) -> bool | None:
        """Whether a 2xx reply says yes; None when it cannot be read (an error)."""
        if self.accept_regex is not None:
            return bool(self.accept_regex.search(content.decode("utf-8", "replace")))
        try:
            reply = json.loads(content)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        try:
            return bool(self.accept.search(reply))
        except (jmespath.exceptions.JMESPathError, RecursionError):
            return False


DEFAULT_DELIVERY = Delivery(accept=jmespath.compile(DEFAULT_ACCEPT))


def parse_delivery(raw: Any, stored_headers: dict[str, str] | None = None) -> dict | None:
    """Validate a buyer's `delivery`; return what is stored (None: the default contract).
    A header sent back in its redacted form keeps the stored value."""
    if raw is None:
        return None
    where = "delivery"
    known = {"method", "format", "headers", "fields", "accept", "accept_regex"}
    if not isinstance(raw, dict) or set(raw) - known:
        raise ValidationError(CODE, where, "must be an object with " + ", ".join(sorted(known)))
    method = raw.get("method", "POST")
    if method not in ("POST", "PUT"):
        raise ValidationError(CODE, "delivery.method", "must be POST or PUT")
    fmt = raw.get("format", "json")
    if fmt not in ("json", "form"):
        raise ValidationError(CODE, "delivery.format", "must be json or form")
    headers = raw.get("headers") or {}
    if not isinstance(headers, dict) or len(headers) > 32:
        raise ValidationError(CODE, "delivery.headers", "must be an object of at most 32 headers")
    stored_headers = stored_headers or {}
    kept = {}
    for name, value in headers.items():
        field = f"delivery.headers.{name}"
        if not isinstance(name, str) or not _HEADER_NAME.match(name) or name.lower() in _RESERVED_HEADERS:
            raise ValidationError(CODE, field, "is not a header Floodgate lets a buyer set")
        if not isinstance(value, str) or len(value) > 1024 or any(c in value for c in "\r\n\0"):
            raise ValidationError(CODE, field, "must be a string of at most 1024 characters, one line")
        if name in stored_headers and value == redact(stored_headers[name]):
            value = stored_headers[name]
        kept[name] = value
    out: dict[str, Any] = {"method": method, "format": fmt, "headers": kept}
    if raw.get("fields") is not None:
        _try_render(_compile_fields(raw["fields"], "delivery.fields"), "delivery.fields", fmt == "json")
        out["fields"] = raw["fields"]
    if raw.get("accept") is not None and raw.get("accept_regex") is not None:
        raise ValidationError(CODE, "delivery.accept", "give accept or accept_regex, not both")
    if raw.get("accept_regex") is not None:
        pattern = raw["accept_regex"]
        if not isinstance(pattern, str) or not pattern or len(pattern) > 1024:
            raise ValidationError(CODE, "delivery.accept_regex", "must be a regular expression")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValidationError(CODE, "delivery.accept_regex", f"is not a valid regular expression: {exc}") \
                from None
        out["accept_regex"] = pattern
    else:
        out["accept"] = raw.get("accept", DEFAULT_ACCEPT)
        _jmespath(out["accept"], "delivery.accept")
    return out


def compile_delivery(stored: dict | None) -> Delivery:
    """The Delivery of a stored `delivery` (as parse_delivery returned it)."""
    if stored is None:
        return DEFAULT_DELIVERY
    fields = None
    if stored.get("fields") is not None:
        fields = tuple(_compile_fields(stored["fields"], "delivery.fields"))
    regex = re.compile(stored["accept_regex"]) if stored.get("accept_regex") else None
    return Delivery(stored["method"], stored["format"], tuple(stored.get("headers", {}).items()), fields,
                    None if regex else jmespath.compile(stored.get("accept", DEFAULT_ACCEPT)), regex)


def shown_delivery(stored: dict | None) -> dict | None:
    """`delivery` as GET shows it: header values redacted."""
    if stored is None:
        return None
    return {**stored, "headers": {k: redact(v) for k, v in stored.get("headers", {}).items()}}


@dataclass(frozen=True)
class Ping:
    """A ping/post buyer's ping: where, what, how its bid is read."""

    url: str
    fields: tuple[_Field, ...]
    bid: Any  # compiled JMESPath
    min_bid: Decimal

    def body(self, context: dict) -> bytes:
        values = {}
        for f in self.fields:
            try:
                values[f.name] = f.value(context, True)
            except Exception as exc:
                log.warning("ping template %s of buyer %s failed: %s", f.name, context.get("buyer_id"), exc)
                values[f.name] = None
        try:
            return json.dumps(values, separators=(",", ":"), default=str).encode()
        except Exception as exc:
            log.warning("ping of buyer %s could not be encoded: %s", context.get("buyer_id"), exc)
            return json.dumps({f.name: None for f in self.fields}).encode()

    def read_bid(self, content: bytes) -> tuple[Decimal | None, Any]:
        """(bid, parsed reply): the bid is None when the reply has none usable."""
        try:
            reply = json.loads(content)
            found = self.bid.search(reply)
        except (ValueError, UnicodeDecodeError, RecursionError, jmespath.exceptions.JMESPathError):
            return None, None
        if isinstance(found, bool) or not isinstance(found, (int, float, str)):
            return None, reply
        try:
            bid = Decimal(str(found)).quantize(Decimal("0.01"))
        except InvalidOperation:
            return None, reply
        if not bid.is_finite() or bid <= 0 or bid < self.min_bid or bid >= Decimal("1e10"):
            return None, reply
        return bid, reply


def parse_ping(raw: Any, parse_url, parse_money) -> dict | None:
    """Validate a buyer's `ping`; return what is stored. `parse_url` and `parse_money` are
    the buyer's own validators (the ping URL obeys the endpoint's rules)."""
    if raw is None:
        return None
    known = {"url", "fields", "bid", "min_bid"}
    if not isinstance(raw, dict) or set(raw) - known or "url" not in raw or "bid" not in raw:
        raise ValidationError(CODE, "ping", 'must be an object {"url", "fields", "bid", "min_bid"}')
    url = parse_url("ping.url", raw["url"])
    fields = raw.get("fields") or {}
    if fields:
        _try_render(_compile_fields(fields, "ping.fields"), "ping.fields", True)
    _jmespath(raw["bid"], "ping.bid")
    min_bid = parse_money("ping.min_bid", raw.get("min_bid", "0.00"))
    return {"url": url, "fields": fields, "bid": raw["bid"], "min_bid": f"{min_bid:.2f}"}


def compile_ping(stored: dict | None) -> Ping | None:
    if stored is None:
        return None
    fields = tuple(_compile_fields(stored["fields"], "ping.fields")) if stored.get("fields") else ()
    return Ping(stored["url"], fields, jmespath.compile(stored["bid"]), Decimal(stored["min_bid"]))
