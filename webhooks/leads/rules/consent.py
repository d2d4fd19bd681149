"""Consent evidence a buyer may require (docs/api.md "Consent, suppression and pre-ping";
docs/leads.md "Consent certificates"): what `require_consent` may name."""

from __future__ import annotations

from typing import Any

from webhooks.errors import ValidationError

TRUSTEDFORM, JORNAYA = "trustedform", "jornaya"
KINDS = (TRUSTEDFORM, JORNAYA)


def parse_required(code: str, raw: Any) -> list[str]:
    """A buyer's `require_consent`: a list of "trustedform" and "jornaya"."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(x, str) and x in KINDS for x in raw):
        raise ValidationError(code, "require_consent", 'must be a list of "trustedform" and "jornaya"')
    return sorted(set(raw))
