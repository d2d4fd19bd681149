"""CSV as Floodgate writes it: a text cell that a spreadsheet would read as a formula (it
begins with `=`, `+`, `-`, `@`, tab or carriage return) gets a leading `'` (OWASP "CSV
Injection"); numbers are written as numbers. See docs/security.md."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from decimal import Decimal

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def cell(value: object) -> str:
    """One cell. int and Decimal values are figures Floodgate computed, written as numbers
    (`-12.50` stays a negative amount a spreadsheet can add up: a number runs nothing);
    everything else is text, escaped when it begins like a formula (an id `-A1-B1`)."""
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    text = str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def write(header: Sequence[str], rows: Iterable[Iterable[object]]) -> str:
    """A CSV document: the header line, then one line per row, every cell through `cell`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([cell(name) for name in header])
    writer.writerows([cell(value) for value in row] for row in rows)
    return out.getvalue()
