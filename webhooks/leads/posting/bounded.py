"""What an admin's expressions may cost per lead (docs/api.md "Admin input is bounded too"): JMESPath
bounded when it is saved (length, depth, projections, multiselects, pipes) and while it runs
(steps, and the size of what it walks and makes); `accept_regex` matched by RE2, in linear
time. The bounds and their reasons: docs/buyers.md, "What an expression may cost"."""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jmespath
import jmespath.exceptions
import jmespath.functions
import jmespath.visitor
import re2  # type: ignore[import-untyped]  # google-re2 ships no types

if TYPE_CHECKING:
    from jmespath.visitor import _TreeNode

MAX_EXPRESSION_CHARS = 1024
MAX_DEPTH = 24  # of the parsed expression
MAX_NODES = 256
MAX_PROJECTIONS = 8  # `[*]`, `*`, `[?...]` and `[]`: each runs what follows it once per element
MAX_MULTISELECTS = 16  # `[a, b]` and `{a: a}`: each makes a value that holds what it is given
MAX_PIPES = 8
# At evaluation: steps (AST nodes visited) and units (a string or a key costs its length, any
# other value 1, a container the sum of what it holds, counted as if written out), charged for
# every value the first time a step returns it and again whenever a comparison or a function
# walks it. A JSON lead of 256 KiB is well under MAX_UNITS: any honest expression stays far
# from both bounds, and no expression can make or walk more than MAX_UNITS.
MAX_STEPS = 5_000
MAX_UNITS = 2_000_000

_PROJECTIONS = {"projection", "value_projection", "filter_projection", "flatten"}
_MULTISELECTS = {"multi_select_list", "multi_select_dict"}

MAX_REGEX_CHARS = 1024
MAX_REGEX_PROGRAM = 256  # RE2's program size: its match time is linear, times this


class ExpressionRefused(ValueError):
    """An expression or pattern that is not saved: the message says which bound or error."""


class ExpressionBudgetExceeded(Exception):
    """An evaluation that would take more steps or units than one evaluation may."""


@dataclass(frozen=True)
class Expression:
    """A compiled JMESPath expression that runs within MAX_STEPS and MAX_UNITS."""

    source: str
    parsed: _TreeNode

    def search(self, data: Any) -> Any:
        """The expression's value on `data`; ExpressionBudgetExceeded past a bound (as well
        as jmespath's own errors and RecursionError on data nested too deep)."""
        return _Interpreter().visit(self.parsed, data)


def compile_jmespath(source: Any) -> Expression:
    """`source` compiled, or ExpressionRefused: not a string of 1 to MAX_EXPRESSION_CHARS,
    not JMESPath, or past one of the static bounds."""
    if not isinstance(source, str) or not 0 < len(source) <= MAX_EXPRESSION_CHARS:
        raise ExpressionRefused(f"must be a JMESPath expression of 1 to {MAX_EXPRESSION_CHARS} characters")
    try:
        parsed = jmespath.compile(source).parsed
    except (jmespath.exceptions.JMESPathError, RecursionError) as exc:
        raise ExpressionRefused(f"is not a valid JMESPath expression: {exc}") from None
    counts = {"node": 0, "projection": 0, "multiselect": 0, "pipe": 0}
    depth = _walk(parsed, 1, counts)
    for what, limit in (
        ("node", MAX_NODES),
        ("projection", MAX_PROJECTIONS),
        ("multiselect", MAX_MULTISELECTS),
        ("pipe", MAX_PIPES),
    ):
        if counts[what] > limit:
            raise ExpressionRefused(f"has more than {limit} {what}s")
    if depth > MAX_DEPTH:
        raise ExpressionRefused(f"nests deeper than {MAX_DEPTH}")
    return Expression(source=source, parsed=parsed)


def _walk(node: _TreeNode, depth: int, counts: dict[str, int]) -> int:
    """The depth of the tree under `node`; counts its nodes by kind."""
    kind = node["type"]
    counts["node"] += 1
    counts["projection"] += kind in _PROJECTIONS
    counts["multiselect"] += kind in _MULTISELECTS
    counts["pipe"] += kind == "pipe"
    if depth > MAX_DEPTH:
        return depth
    # a slice's children are its integers, not nodes
    return max([depth] + [_walk(c, depth + 1, counts) for c in node.get("children", ()) if isinstance(c, dict)])


class _Functions(jmespath.functions.Functions):
    """jmespath's functions; `join` checks its output's size before it makes it (a long
    separator times a long list is the one function that multiplies sizes)."""

    @jmespath.functions.signature({"types": ["string"]}, {"types": ["array-string"]})
    def _func_join(self, separator: str, array: list[str]) -> str:
        size = sum(map(len, array)) + len(separator) * max(0, len(array) - 1)
        if size > MAX_UNITS:
            raise ExpressionBudgetExceeded(f"join would make {size} characters")
        return separator.join(array)


_FUNCTIONS = _Functions()
_OPTIONS = jmespath.visitor.Options(custom_functions=_FUNCTIONS)


class _Interpreter(jmespath.visitor.TreeInterpreter):
    """jmespath's interpreter, counting steps and units (see MAX_STEPS, MAX_UNITS)."""

    def __init__(self) -> None:
        super().__init__(_OPTIONS)
        self.steps = 0
        self.units = 0
        self._seen: dict[int, tuple[Any, int]] = {}  # id -> (container, its size): kept alive

    def _charge(self, units: int) -> None:
        self.units += units
        if self.units > MAX_UNITS:
            raise ExpressionBudgetExceeded(f"more than {MAX_UNITS} units of work")

    def _size(self, value: Any) -> int:
        """`value`'s size as if written out; a container's is remembered (shared values, as
        `[@, @]` makes, are counted each time they occur, but walked once)."""
        if isinstance(value, str):
            return len(value) + 1
        if not isinstance(value, (list, dict)):
            return 1
        hit = self._seen.get(id(value))
        if hit is not None:
            return hit[1]
        try:
            if isinstance(value, list):
                size = 1 + sum(self._size(v) for v in value)
            else:
                size = 1 + sum(len(k) + self._size(v) for k, v in value.items())
        except RecursionError:
            raise ExpressionBudgetExceeded("a value nested too deep") from None
        self._seen[id(value)] = (value, size)
        return size

    def visit(self, node: _TreeNode, *args: Any, **kwargs: Any) -> Any:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ExpressionBudgetExceeded(f"more than {MAX_STEPS} steps")
        result = super().visit(node, *args, **kwargs)
        if isinstance(result, (list, dict)):
            if id(result) not in self._seen:
                self._charge(self._size(result))
        else:
            self._charge(self._size(result))
        return result

    def visit_comparator(self, node: _TreeNode, value: Any) -> Any:
        left = self.visit(node["children"][0], value)
        right = self.visit(node["children"][1], value)
        self._charge(min(self._size(left), self._size(right)))  # what == walks
        return self.COMPARATOR_FUNC[node["value"]](left, right) if _comparable(node["value"], left, right) else None

    def visit_function_expression(self, node: _TreeNode, value: Any) -> Any:
        args = [self.visit(child, value) for child in node["children"]]
        self._charge(sum(self._size(a) for a in args))  # what the function may walk or copy
        return _FUNCTIONS.call_function(node["value"], args)

    def visit_flatten(self, node: _TreeNode, value: Any) -> Any:
        base = self.visit(node["children"][0], value)
        if not isinstance(base, list):
            return None
        self._charge(sum(len(e) if isinstance(e, list) else 1 for e in base))  # before it is made
        merged: list[Any] = []
        for element in base:
            if isinstance(element, list):
                merged.extend(element)
            else:
                merged.append(element)
        return merged


def _comparable(op: str, left: Any, right: Any) -> bool:
    """jmespath's rule: == and != take anything, ordering numbers and strings only."""
    return op in ("eq", "ne") or all(
        isinstance(x, (int, float, str)) and not isinstance(x, bool) for x in (left, right)
    )


def compile_regex(pattern: Any) -> Any:
    """`pattern` compiled by RE2 (linear-time matching), or ExpressionRefused: what RE2 cannot
    run (backreferences, lookaround) or a program over MAX_REGEX_PROGRAM."""
    if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_REGEX_CHARS:
        raise ExpressionRefused(f"must be a regular expression of 1 to {MAX_REGEX_CHARS} characters")
    try:
        compiled = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ExpressionRefused(f"is not a regular expression RE2 can run: {reason}") from None
    if compiled.programsize > MAX_REGEX_PROGRAM:
        raise ExpressionRefused(f"is too large: RE2 program of {compiled.programsize} > {MAX_REGEX_PROGRAM}")
    return compiled


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is the admin's 400, not a line on stderr
_RE2_OPTIONS.never_capture = True  # only "is there a match" is asked: RE2's fastest engine


# Templates (leads/posting/integration.py): the size of what a str method makes, known before it is
# made when an argument sets it (a width, a tab size, a replacement, a separator, a table).
_WIDTH_METHODS = {"center", "ljust", "rjust", "zfill"}


_ESCAPE_GROWTH = 5  # the most HTML escaping makes of one character ("&#34;" for `"`)


def str_method_size(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """An upper bound of the length of `method(*args, **kwargs)` when `method` is a str (or
    bytes) method whose result an argument can make large, or int.to_bytes; None for any
    other callable."""
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    if isinstance(owner, int) and name == "to_bytes":
        return _int(args[0] if args else kwargs.get("length", 1))
    if not isinstance(owner, (str, bytes, bytearray)):
        return None
    n = len(owner)
    first = args[0] if args else None
    # A subclass may escape what it is given first (Markup, what `|tojson` returns, makes a
    # `"` into `&#34;`): what its arguments add is counted five times over.
    grows = 1 if type(owner) in (str, bytes, bytearray) else _ESCAPE_GROWTH
    text = str if isinstance(owner, str) else (bytes, bytearray)
    if name in _WIDTH_METHODS:
        return max(n, _int(first if args else kwargs.get("width")))
    if name == "expandtabs":
        tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
        return n + tabs * _int(first if args else kwargs.get("tabsize", 8))
    if name == "replace" and len(args) >= 2 and all(isinstance(a, text) for a in args[:2]):
        old, new = args[0], args[1]
        # n + 1 for an empty `old` (a `new` between every two); an escaped `old` is no shorter
        hits = owner.count(old) if grows == 1 else n + 1 if not old else n // len(old)
        count = _int(args[2] if len(args) > 2 else kwargs.get("count", -1), default=-1)
        return n + (hits if count < 0 else min(hits, count)) * max(0, grows * len(new) - len(old))
    if name == "join" and isinstance(first, (list, tuple)):
        items = sum(len(x) if isinstance(x, (str, bytes)) else 0 for x in first)
        return grows * items + n * max(0, len(first) - 1)
    if name == "translate":
        longest = (
            max((len(v) for v in first.values() if isinstance(v, str)), default=1) if isinstance(first, dict) else 1
        )
        return n * max(1, longest)
    return None


def format_size(template: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """An upper bound (up to a small constant factor) of the length of
    `template.format(*args, **kwargs)`: its text, and per replacement field the longest
    argument plus any width or precision. A width taken from an argument (`{:{}}`) counts as
    unbounded."""
    values = list(args) + list(kwargs.values())
    longest = max((len(v) if isinstance(v, str) else len(str(v)) for v in values), default=0)
    size = 0
    for literal, field, spec, _conversion in string.Formatter().parse(template):
        size += len(literal)
        if field is None:
            continue
        if spec and "{" in spec:
            return MAX_UNITS * MAX_UNITS
        size += longest + max((int(d) for d in _DIGITS.findall(spec or "")), default=0)
    return size


_DIGITS = re2.compile(r"[0-9]+")


def _int(value: Any, default: int = 0) -> int:
    """An int argument as given (a non-int is left for the method itself to refuse)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default
