"""The two-letter codes of the US states, the District of Columbia and the territories (USPS),
the one list a buyer's `states` and a publisher's `state` field are checked against."""

from __future__ import annotations

# fmt: off
CODES = frozenset({
    "AL", "AK", "AZ", "AR", "CA", "CO", "CT", "DE", "FL", "GA", "HI", "ID", "IL", "IN", "IA", "KS",
    "KY", "LA", "ME", "MD", "MA", "MI", "MN", "MS", "MO", "MT", "NE", "NV", "NH", "NJ", "NM", "NY",
    "NC", "ND", "OH", "OK", "OR", "PA", "RI", "SC", "SD", "TN", "TX", "UT", "VT", "VA", "WA", "WV",
    "WI", "WY", "DC", "AS", "GU", "MP", "PR", "VI", "UM",
})
# fmt: on


def code(value: object) -> str | None:
    """`value` as a state code (upper-cased, trimmed), or None when it is no state's code."""
    if not isinstance(value, str) or len(value) > 8:
        return None
    upper = value.strip().upper()
    return upper if upper in CODES else None
