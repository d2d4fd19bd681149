"""CSV cells Floodgate writes (webhooks/formats/csvsafe.py): OWASP CSV injection."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest

from webhooks.formats import csvsafe


@pytest.mark.parametrize("text", ["=1+2", "+1", "-A1-B1", "@SUM(A1)", "\tx", "\rx", "-12.50", '=HYPERLINK("x")'])
def test_a_text_cell_beginning_like_a_formula_gets_a_leading_quote(text):
    assert csvsafe.cell(text) == "'" + text


@pytest.mark.parametrize("text", ["acme", "a=b", "1-2", "", "'=quoted already"])
def test_other_text_is_written_as_given(text):
    assert csvsafe.cell(text) == text


def test_numbers_are_written_as_numbers_and_none_as_empty():
    assert [csvsafe.cell(v) for v in (Decimal("-12.50"), -3, Decimal("0.25"), None)] == ["-12.50", "-3", "0.25", ""]


def test_a_document_reads_back_with_every_text_cell_escaped():
    doc = csvsafe.write(["key", "amount"], [["=cmd|' /C calc'!A0", Decimal("-1.00")], ["ok", 2]])
    assert list(csv.reader(io.StringIO(doc))) == [["key", "amount"], ["'=cmd|' /C calc'!A0", "-1.00"], ["ok", "2"]]
