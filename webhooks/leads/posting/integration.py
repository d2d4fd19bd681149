"""Buyer integrations (docs/api.md "Buyer integrations"): how a buyer wants its post and its ping
built, and how its reply is judged.

Everything is compiled once, when the buyer is saved (and again when the config cache
reloads): Jinja2 templates in the sandbox, JMESPath expressions, regular expressions. A
template the sandbox forbids is found at save time by rendering it with a sample lead, since
the sandbox only refuses an unsafe attribute when it is used. At delivery a template only
renders; a missing lead field renders empty (JSON: null), and a render that still fails
yields an empty value rather than an error in the publisher's request.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlencode

import jmespath
import jmespath.exceptions
from jinja2 import ChainableUndefined, TemplateError, Undefined, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.nodes import EvalContext
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from webhooks.errors import Checks, ValidationError
from webhooks.leads.posting import bounded
from webhooks.leads.posting.bounded import ExpressionBudgetExceeded, ExpressionRefused
from webhooks.logs import redact_secret

log = logging.getLogger(__name__)

Filter = Callable[..., Any]  # a Jinja filter: Jinja's own loose signatures (an eval context first, *args)

CODE = "invalid_buyer"
DEFAULT_ACCEPT = "accepted == `true`"
_WHOLE_EXPR = re.compile(r"\s*\{\{(.*)\}\}\s*", re.S)  # fullmatch, as every pattern here
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}")
_RESERVED_HEADERS = {"content-type", "content-length", "host", "idempotency-key", "transfer-encoding", "connection"}


class _Undefined(ChainableUndefined):
    """A missing value chains (`ping.bid_id` when there is no ping) and renders as "". What the
    sandbox refused (an unsafe attribute) raises SecurityError when used, chained or not:
    plain chaining would hide `''.__class__.__mro__` behind an empty string."""

    def _refused(self) -> bool:
        return self._undefined_exception is SecurityError

    def __getattr__(self, name: str) -> Any:
        if self._refused() and not name.startswith("_undefined"):
            self._fail_with_undefined_error()
        return super().__getattr__(name)

    def __getitem__(self, key: Any) -> Any:
        if self._refused():
            self._fail_with_undefined_error()
        return super().__getitem__(key)

    def __str__(self) -> str:
        if self._refused():
            self._fail_with_undefined_error()
        return super().__str__()


# What one render may cost (docs/api.md: a template cheap on the sample lead may loop on a real
# one): its output, and its CPU time, checked at every attribute, item, call, operator and chunk
# of output. Over either: RenderBudgetExceeded, and the lead is not sent to that buyer.
RENDER_MAX_BYTES = 512 * 1024
RENDER_MAX_S = 0.025
# What the calls, filters, operators and `~` of one render may make in all (characters or
# items), charged before a value is made when its arguments say how large it will be
# (`'x'.center(10 ** 9)`), else as soon as it is made (a constant multiple of what it was given).
RENDER_MAX_MADE = 4 * RENDER_MAX_BYTES
_SEQ_LIMIT = 10_000  # batch/slice sizes (they pad to that many items)
_INT_BITS = 100_000  # an integer a template computes (`9 ** 9 ** 9` would run for hours)
# A printf width or precision of five digits or more, or taken from an argument (`%*s`).
_WIDE_FORMAT = re.compile(r"%[-+ #0]*(?:\*|[0-9]{5,}|[0-9]*\.(?:\*|[0-9]{5,}))")
# Statements a field template may use; with no loop inside a loop, no macro and no variable
# a template could grow by doubling, its work is bounded by its own size times the lead's.
_ALLOWED_STATEMENTS = (nodes.Output, nodes.If, nodes.For)
# Filters left out: their cost is not bounded by their output (striptags rescans from every
# "<!--", urlize runs regexes per word) or they only make markup.
_REFUSED_FILTERS = ("striptags", "urlize", "wordwrap", "pprint", "xmlattr", "forceescape", "safe")


class RenderBudgetExceeded(Exception):
    """A template took more time or produced more output than one render may."""


class _Collector:
    """The garbage collector held off while renders run: a full collection a render happened
    to start would walk the whole process's objects (tens of ms on a busy machine) and be
    charged to the template. A render's allocations are bounded by its budget, and the
    collection runs after it. Counted, so that renders of other threads nest; no callback on
    every collection (gc.callbacks made an allocation-heavy loop about a sixth slower)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.was_enabled = True

    def hold(self) -> None:
        with self.lock:
            if self.depth == 0:
                self.was_enabled = gc.isenabled()
                gc.disable()
            self.depth += 1

    def release(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.was_enabled:
                gc.enable()


_COLLECTOR = _Collector()


@dataclass
class _Budget:
    deadline: float
    left: int = RENDER_MAX_BYTES
    made: int = RENDER_MAX_MADE

    def make(self, size: int) -> None:
        self.made -= size
        if self.made < 0:
            raise RenderBudgetExceeded(f"rendering would make more than {RENDER_MAX_MADE} characters or items")
        self.tick()

    def tick(self) -> None:
        if time.thread_time() > self.deadline:
            raise RenderBudgetExceeded(f"rendering took longer than {RENDER_MAX_S * 1000:.0f} ms")

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise RenderBudgetExceeded(f"rendering produced more than {RENDER_MAX_BYTES} bytes")
        self.tick()


_BUDGET: ContextVar[_Budget | None] = ContextVar("render_budget", default=None)


@contextmanager
def render_budget() -> Iterator[_Budget | None]:
    """One render's budget (per greenlet or thread: a context variable)."""
    # CPU time of this thread, not the wall clock: a render never yields to another greenlet
    # (no I/O), so this is the render's own cost, and a busy machine does not make a valid
    # template fail (or a buyer's PUT be refused) for the time other processes took; nor the
    # garbage collector's, held off meanwhile (_Collector).
    _COLLECTOR.hold()
    token = _BUDGET.set(_Budget(time.thread_time() + RENDER_MAX_S))
    try:
        yield _BUDGET.get()
    finally:
        _BUDGET.reset(token)
        _COLLECTOR.release()


def _tick() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.tick()


def _check_size(size: int) -> None:
    budget = _BUDGET.get()
    if size > (budget.left if budget is not None else RENDER_MAX_BYTES):
        raise RenderBudgetExceeded(f"a value of {size} bytes or items is more than one render may make")
    _make(size)


def _make(size: int) -> None:
    """Charge `size` to what this render may make (RENDER_MAX_MADE)."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.make(size)
    elif size > RENDER_MAX_MADE:
        raise RenderBudgetExceeded(f"a value of {size} characters or items is more than one render may make")


def _length(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)) else 0


class _CodeGenerator(CodeGenerator):
    """Jinja's compiler, with `a ~ b` built by the environment's `bounded_concat`, inside the budget."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every hook it offers also checking the render's budget, and the
    operators that can multiply a value's size intercepted (which also stops Jinja folding
    `'x' * 10 ** 12` into a constant when it compiles)."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})
    code_generator_class = _CodeGenerator

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # the sandbox's own signature
        _tick()
        if args and getattr(__obj, "__name__", "") == "join" and isinstance(getattr(__obj, "__self__", None), str):
            args = (list(args[0]), *args[1:])  # measured before it is joined
        size = bounded.str_method_size(__obj, args, kwargs)
        if size is not None:
            _make(size)
        result = super().call(__context, __obj, *args, **kwargs)
        if size is None:
            _make(_length(result))
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        template = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            mapping = args[0] if value.__name__ == "format_map" and args and isinstance(args[0], dict) else kwargs
            _make(bounded.format_size(template, args if mapping is kwargs else (), mapping))
            return wrapped(*args, **kwargs)

        return checked

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _tick()
        if operator == "*":
            _check_product(left, right)
        elif operator == "**":
            _check_power(left, right)
        elif operator == "%" and isinstance(left, str):
            if _WIDE_FORMAT.search(left):
                raise RenderBudgetExceeded("a format width or precision that large is not rendered")
            values = right if isinstance(right, tuple) else (right,)
            _make(len(left) + left.count("%") * max((len(str(v)) for v in values), default=0))
        elif operator == "+":
            _make(_length(left) + _length(right))
        return super().call_binop(context, operator, left, right)

    def bounded_concat(self, parts: tuple[Any, ...]) -> str:
        """`a ~ b ~ ...`, charged before it is joined."""
        strings = [str(p) for p in parts]
        _make(sum(map(len, strings)))
        return "".join(strings)


def _check_product(left: Any, right: Any) -> None:
    for seq, n in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
            _check_size(len(seq) * max(0, n))
    if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > _INT_BITS:
        raise RenderBudgetExceeded("an integer that large is not computed")


def _check_power(base: Any, exp: Any) -> None:
    if (
        isinstance(base, int)
        and isinstance(exp, int)
        and abs(base) > 1
        and exp > 0
        and base.bit_length() * exp > _INT_BITS
    ):
        raise RenderBudgetExceeded("an integer that large is not computed")


def _check_count(n: Any) -> None:
    if int(n) > _SEQ_LIMIT:
        raise RenderBudgetExceeded(f"more than {_SEQ_LIMIT} items in one batch or slice")


def _bounded_filters(filters: Mapping[str, Filter]) -> dict[str, Filter]:
    """The filters a field template may use, those that can grow their input wrapped so that
    their output's size is known before it is made."""
    original = dict(filters)
    growing, refusing = _growing_filters(original), _refusing_filters(original)
    for name in ("replace", "join", "tojson", "sum"):  # eval context first
        # Jinja's marker of a filter taking the eval context first, set on the function itself
        vars((growing if name in growing else refusing)[name])["jinja_pass_arg"] = vars(original[name])[
            "jinja_pass_arg"
        ]
    kept = {k: _charged(v) for k, v in original.items() if k not in _REFUSED_FILTERS}
    kept.update(growing)
    kept.update(format=refusing["format"], batch=refusing["batch"], slice=refusing["slice"])
    kept.update(tojson=_charged(refusing["tojson"]), sum=_charged(refusing["sum"]))
    return kept


def _growing_filters(original: dict[str, Filter]) -> dict[str, Filter]:
    """join, replace, center, indent: their output's size checked before it is made."""

    def checked_join(eval_ctx: EvalContext, value: Iterable[Any], d: Any = "", attribute: Any = None) -> Any:
        items = list(value)
        _check_size(sum(len(str(x)) for x in items) + len(str(d)) * max(0, len(items) - 1))
        return original["join"](eval_ctx, items, d, attribute)

    def replace(eval_ctx: EvalContext, s: Any, old: Any, new: Any, count: Any = None) -> Any:
        s, old, new = str(s), str(old), str(new)
        n = (len(s) + 1 if old == "" else s.count(old)) if count is None else max(0, int(count))
        _check_size(len(s) + n * max(0, len(new) - len(old)))
        return original["replace"](eval_ctx, s, old, new, count)

    def center(value: Any, width: Any = 80) -> Any:
        _check_size(int(width))
        return original["center"](value, width)

    def indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> Any:
        s = str(s)
        _check_size(len(s) + (s.count("\n") + 1) * (len(width) if isinstance(width, str) else int(width)))
        return original["indent"](s, width, first, blank)

    return {"join": checked_join, "replace": replace, "center": center, "indent": indent}


def _refusing_filters(original: dict[str, Filter]) -> dict[str, Filter]:
    """format, sum, tojson, batch, slice: refused when their arguments would make too much."""

    def format_(value: Any, *args: Any, **kwargs: Any) -> Any:
        if _WIDE_FORMAT.search(str(value)):
            raise RenderBudgetExceeded("a format width or precision that large is not rendered")
        return original["format"](value, *args, **kwargs)

    def sum_(environment: Any, iterable: Iterable[Any], attribute: Any = None, start: Any = 0) -> Any:
        if not isinstance(start, (int, float)) or isinstance(start, bool):  # lists: quadratic in C
            raise RenderBudgetExceeded("sum adds numbers only")
        return original["sum"](environment, iterable, attribute, start)

    def tojson(eval_ctx: EvalContext, value: Any, indent: Any = None) -> Any:
        if isinstance(indent, (int, str)) and not isinstance(indent, bool) and _length_of(indent) > 16:
            raise RenderBudgetExceeded("a JSON indent that large is not rendered")
        return original["tojson"](eval_ctx, value, indent)

    def batch(value: Any, linecount: Any, fill_with: Any = None) -> Any:
        _check_count(linecount)
        return original["batch"](value, linecount, fill_with)

    def slice_(value: Any, slices: Any, fill_with: Any = None) -> Any:
        _check_count(slices)
        return original["slice"](value, slices, fill_with)

    return {"format": format_, "sum": sum_, "tojson": tojson, "batch": batch, "slice": slice_}


def _length_of(indent: int | str) -> int:
    return indent if isinstance(indent, int) else len(indent)


def _charged(f: Filter) -> Filter:
    """A filter whose result is charged to the render's budget as soon as it is made."""

    @functools.wraps(f)  # keeps jinja_pass_arg
    def charged(*args: Any, **kwargs: Any) -> Any:
        result = f(*args, **kwargs)
        _make(_length(result))
        return result

    return charged


# Immutable: a template may not change the lead it is given (`lead.pop(...)`), which the routing
# of the next buyers (their dedupe keys) still reads.
ENV = _BudgetedEnvironment(undefined=_Undefined, autoescape=False)
ENV.filters = _bounded_filters(ENV.filters)
for _name in ("lipsum", "cycler", "joiner", "namespace"):  # no use in a field; lipsum(10 ** 5) is megabytes
    ENV.globals.pop(_name, None)


def _check_statements(source: str) -> None:
    """Refuse what a field template does not need and whose cost could explode on a real
    lead: a loop inside a loop, macros, `set` (a variable doubled again and again), includes."""
    tree = ENV.parse(source)
    for node in tree.find_all(nodes.Stmt):
        if not isinstance(node, _ALLOWED_STATEMENTS):
            raise TemplateError(f"{type(node).__name__.lower()} statements are not allowed in a field template")
    for loop in tree.find_all(nodes.For):
        if any(True for _ in loop.find_all(nodes.For)):
            raise TemplateError("a loop inside a loop is not allowed in a field template")


SAMPLE = {
    "lead": {
        "first_name": "Ada",
        "last_name": "Lovelace",
        "email": "ada@example.com",
        "phone": "+15125550100",
        "state": "TX",
        "zip": "73301",
    },
    "lead_id": "sample-lead",
    "publisher_id": "sample-publisher",
    "buyer_id": "sample-buyer",
    "price": "10.00",
    "ping": {"bid": "9.50", "bid_id": "sample-bid"},
}


class _Field:
    """One output field: a template, or a single `{{ expr }}` whose value keeps its type."""

    def __init__(self, name: str, source: str, where: str):
        self.name = name
        try:
            whole = _WHOLE_EXPR.fullmatch(source)
            self.expr = (
                ENV.compile_expression(whole.group(1), undefined_to_none=False)
                if whole and "{{" not in whole.group(1)
                else None
            )
            if self.expr is None:
                _check_statements(source)
            self.template = None if self.expr else ENV.from_string(source)
        except (TemplateError, SyntaxError, RecursionError) as exc:  # SyntaxError: 200 nested `+`, Python's limit
            raise ValidationError(CODE, where, f"is not a valid template: {exc}") from None

    def value(self, context: dict[str, Any], native: bool) -> Any:
        """The field's value for `context`, within the render budget of the caller (see
        render_budget; without one, a budget of its own)."""
        budget = _BUDGET.get()
        if budget is None:
            with render_budget():
                return self.value(context, native)
        if self.expr is not None:
            result = self.expr(**context)
            if isinstance(result, str):
                budget.spend(len(result))
            if isinstance(result, Undefined):
                if result._undefined_exception is SecurityError:
                    raise SecurityError(str(result._undefined_message))
                return None if native else ""
            if native:
                return (
                    result if isinstance(result, (str, int, float, bool, list, dict)) or result is None else str(result)
                )
            return "" if result is None else str(result)
        assert self.template is not None  # no expression: __init__ compiled a template
        out = []
        for chunk in self.template.generate(**context):
            budget.spend(len(chunk))
            out.append(chunk)
        return "".join(out)


def _render_all(fields: tuple[_Field, ...], context: dict[str, Any], native: bool, what: str) -> dict[str, Any]:
    """Every field's value under one render budget. A field that fails renders empty (JSON:
    null), never an error in the publisher's request; a body over its budget raises
    RenderBudgetExceeded: the lead is not sent to that buyer."""
    values: dict[str, Any] = {}
    with render_budget():
        for f in fields:
            try:
                values[f.name] = f.value(context, native)
            except RenderBudgetExceeded:
                log.warning("%s %s of buyer %s is over its render budget", what, f.name, context.get("buyer_id"))
                raise
            except Exception as exc:
                log.warning("%s %s of buyer %s failed: %s", what, f.name, context.get("buyer_id"), exc)
                values[f.name] = None if native else ""
    return values


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


def compile_expression(raw: Any, where: str) -> bounded.Expression:
    """A JMESPath expression within the bounds of bounded.compile_jmespath; ValidationError
    naming `where` when it is none."""
    try:
        return bounded.compile_jmespath(raw)
    except ExpressionRefused as exc:
        raise ValidationError(CODE, where, str(exc)) from None


def load_expression(source: str) -> bounded.Expression:
    """A stored expression compiled: one saved before the static bounds existed still loads
    (its evaluation is bounded all the same)."""
    try:
        return bounded.compile_jmespath(source)
    except ExpressionRefused:
        return bounded.Expression(source=source, parsed=jmespath.compile(source).parsed)


def truthy(expression: bounded.Expression, data: Any, what: str = "filter") -> bool:
    """Whether `expression` is truthy on `data`; False when it fails (a type error, a
    function given the wrong kind of value, data nested too deep, past its budget)."""
    try:
        return bool(expression.search(data))
    except ExpressionBudgetExceeded as exc:
        log.warning("%s %r is over its budget on this lead: %s", what, expression.source[:80], exc)
        return False
    except (jmespath.exceptions.JMESPathError, RecursionError, TypeError, ValueError, OverflowError):
        return False


@dataclass(frozen=True, kw_only=True)
class PostTemplate:
    """A buyer's post: how it is built and how its reply is judged."""

    method: str = "POST"
    format: str = "json"
    headers: tuple[tuple[str, str], ...] = ()
    fields: tuple[_Field, ...] | None = None  # None: the default contract body
    accept: bounded.Expression | None = None  # None with accept_regex
    accept_regex: Any = None  # compiled by RE2 (bounded.compile_regex)

    @property
    def content_type(self) -> str:
        return "application/json" if self.format == "json" else "application/x-www-form-urlencoded"

    def body(self, context: dict[str, Any], default: bytes) -> bytes:
        """The post's body for `context` (lead, lead_id, publisher_id, buyer_id, price, ping)."""
        if self.fields is None:
            return default
        native = self.format == "json"
        values = _render_all(self.fields, context, native, "template")
        try:
            body = (
                json.dumps(values, separators=(",", ":"), default=str).encode()
                if native
                else urlencode(values).encode()
            )
        except Exception as exc:  # never into the publisher's request
            log.warning("post of buyer %s could not be encoded: %s", context.get("buyer_id"), exc)
            empty = {f.name: None if native else "" for f in self.fields}
            return json.dumps(empty).encode() if native else urlencode(empty).encode()
        if len(body) > RENDER_MAX_BYTES:
            raise RenderBudgetExceeded(f"the post would be {len(body)} bytes, more than {RENDER_MAX_BYTES}")
        return body

    def accepted(self, content: bytes) -> bool | None:
        """Whether a 2xx reply says yes; None when it cannot be read or judged within the
        rule's budget (an error). The reply is at most 64 KiB (webhooks/outbound.py)."""
        if self.accept_regex is not None:
            return bool(self.accept_regex.search(content.decode("utf-8", "replace")))
        if self.accept is None:  # a stored accept_regex RE2 cannot run (compile_post)
            return None
        try:
            reply = json.loads(content)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        try:
            return bool(self.accept.search(reply))
        except ExpressionBudgetExceeded as exc:
            log.warning("accept %r is over its budget on a reply: %s", self.accept.source[:80], exc)
            return None
        except (jmespath.exceptions.JMESPathError, RecursionError, TypeError, ValueError, OverflowError):
            return False


DEFAULT_POST = PostTemplate(accept=bounded.compile_jmespath(DEFAULT_ACCEPT))


def parse_delivery(raw: Any, stored_headers: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Validate a buyer's `delivery`; return what is stored (None: the default contract).
    A header sent back in its redacted form keeps the stored value. Each member is checked:
    a ValidationErrors names every bad one."""
    if raw is None:
        return None
    where = "delivery"
    known = {"method", "format", "headers", "fields", "accept", "accept_regex"}
    if not isinstance(raw, dict) or set(raw) - known:
        raise ValidationError(CODE, where, "must be an object with " + ", ".join(sorted(known)))
    check = Checks()
    method = check.run("POST", _one_of, "delivery.method", raw.get("method", "POST"), ("POST", "PUT"))
    fmt = check.run("json", _one_of, "delivery.format", raw.get("format", "json"), ("json", "form"))
    out: dict[str, Any] = {
        "method": method,
        "format": fmt,
        "headers": check.run({}, _kept_headers, raw.get("headers") or {}, stored_headers or {}),
    }
    if raw.get("fields") is not None:
        fields = check.run([], _compile_fields, raw["fields"], "delivery.fields")
        check.run(None, _try_render, fields, "delivery.fields", fmt == "json")
        out["fields"] = raw["fields"]
    out.update(check.run({}, _accept_of, raw))
    check.done()
    return out


def _one_of(field: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValidationError(CODE, field, "must be " + " or ".join(allowed))
    return str(value)


def _kept_headers(headers: Any, stored_headers: dict[str, str]) -> dict[str, str]:
    """A delivery's headers, checked; one sent back in its redacted form keeps the stored value."""
    if not isinstance(headers, dict) or len(headers) > 32:
        raise ValidationError(CODE, "delivery.headers", "must be an object of at most 32 headers")
    kept = {}
    for name, value in headers.items():
        field = f"delivery.headers.{name}"
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name) or name.lower() in _RESERVED_HEADERS:
            raise ValidationError(CODE, field, "is not a header Floodgate lets a buyer set")
        if not isinstance(value, str) or len(value) > 1024 or any(c in value for c in "\r\n\0"):
            raise ValidationError(CODE, field, "must be a string of at most 1024 characters, one line")
        if name in stored_headers and value == redact_secret(stored_headers[name]):
            value = stored_headers[name]
        kept[name] = value
    return kept


def _accept_of(raw: dict[str, Any]) -> dict[str, Any]:
    """A delivery's `accept` (JMESPath, the default when none) or `accept_regex`, checked."""
    if raw.get("accept") is not None and raw.get("accept_regex") is not None:
        raise ValidationError(CODE, "delivery.accept", "give accept or accept_regex, not both")
    if raw.get("accept_regex") is not None:
        pattern = raw["accept_regex"]
        try:
            bounded.compile_regex(pattern)
        except ExpressionRefused as exc:
            raise ValidationError(CODE, "delivery.accept_regex", str(exc)) from None
        return {"accept_regex": pattern}
    accept = raw.get("accept", DEFAULT_ACCEPT)
    compile_expression(accept, "delivery.accept")
    return {"accept": accept}


def compile_post(stored: dict[str, Any] | None) -> PostTemplate:
    """The PostTemplate of a stored `delivery` (as parse_delivery returned it)."""
    if stored is None:
        return DEFAULT_POST
    fields = None
    if stored.get("fields") is not None:
        fields = tuple(_compile_fields(stored["fields"], "delivery.fields"))
    if stored.get("accept_regex"):
        accept, regex = None, _load_regex(stored["accept_regex"])
    else:
        accept, regex = load_expression(stored.get("accept", DEFAULT_ACCEPT)), None
    return PostTemplate(
        method=stored["method"],
        format=stored["format"],
        headers=tuple(stored.get("headers", {}).items()),
        fields=fields,
        accept=accept,
        accept_regex=regex,
    )


def _load_regex(pattern: str) -> Any:
    """A stored accept_regex compiled by RE2. One saved before RE2 ran them that RE2 cannot
    compile (a backreference) is never run by a backtracking engine: every 2xx is an error
    until the buyer is saved again."""
    try:
        return bounded.compile_regex(pattern)
    except ExpressionRefused as exc:
        log.error("stored accept_regex %r cannot be run in linear time: %s", pattern[:80], exc)
        return None


def shown_delivery(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """`delivery` as GET shows it: header values redacted."""
    if stored is None:
        return None
    return {**stored, "headers": {k: redact_secret(v) for k, v in stored.get("headers", {}).items()}}


@dataclass(frozen=True)
class Ping:
    """A ping/post buyer's ping: where, what, how its bid is read."""

    url: str
    fields: tuple[_Field, ...]
    bid: bounded.Expression
    min_bid: Decimal

    def body(self, context: dict[str, Any]) -> bytes:
        values = _render_all(self.fields, context, True, "ping template")
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
        except ExpressionBudgetExceeded as exc:
            log.warning("ping.bid %r is over its budget on a reply: %s", self.bid.source[:80], exc)
            return None, None
        except (ValueError, UnicodeDecodeError, RecursionError, TypeError, jmespath.exceptions.JMESPathError):
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


def parse_ping(
    raw: Any, parse_url: Callable[[str, Any], str], parse_money: Callable[[str, Any], Decimal]
) -> dict[str, Any] | None:
    """Validate a buyer's `ping`; return what is stored. `parse_url` and `parse_money` are
    the buyer's own validators (the ping URL obeys the endpoint's rules)."""
    if raw is None:
        return None
    known = {"url", "fields", "bid", "min_bid"}
    if not isinstance(raw, dict) or set(raw) - known:
        raise ValidationError(CODE, "ping", 'must be an object {"url", "fields", "bid", "min_bid"}')
    check = Checks()
    for name in ("url", "bid"):
        if raw.get(name) is None:
            check.errors.append(ValidationError(CODE, f"ping.{name}", "is required for a ping"))
    url = check.run("", parse_url, "ping.url", raw["url"]) if raw.get("url") is not None else ""
    fields = raw.get("fields") or {}
    if fields:
        compiled = check.run([], _compile_fields, fields, "ping.fields")
        check.run(None, _try_render, compiled, "ping.fields", True)
    if raw.get("bid") is not None:
        check.run(None, compile_expression, raw["bid"], "ping.bid")
    min_bid = check.run(Decimal(0), parse_money, "ping.min_bid", raw.get("min_bid", "0.00"))
    check.done()
    return {"url": url, "fields": fields, "bid": raw["bid"], "min_bid": f"{min_bid:.2f}"}


def compile_ping(stored: dict[str, Any] | None) -> Ping | None:
    if stored is None:
        return None
    fields = tuple(_compile_fields(stored["fields"], "ping.fields")) if stored.get("fields") else ()
    return Ping(stored["url"], fields, load_expression(stored["bid"]), Decimal(stored["min_bid"]))
