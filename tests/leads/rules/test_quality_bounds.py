"""A spec's e-mail fields cost bounded work per lead (docs/api.md "Nothing outside can stall or
exhaust Floodgate"): an address the RFC's length and label limits refuse never reaches
email-validator, and one lead hands it a bounded number of characters however many e-mail
fields its spec declares. Counted, not timed: the library is wrapped to count its input."""

from __future__ import annotations

import pytest

from webhooks.errors import InvalidLead
from webhooks.leads.rules import quality
from webhooks.leads.rules.quality import parse_spec


@pytest.fixture
def checked(monkeypatch) -> list[str]:
    """Every address handed to email-validator, in order."""
    seen: list[str] = []
    real = quality.validate_email

    def counting(text: str, **kwargs):
        seen.append(text)
        return real(text, **kwargs)

    monkeypatch.setattr(quality, "validate_email", counting)
    return seen


def _spec(n: int):
    spec = parse_spec({f"e{i}": {"type": "email"} for i in range(n)})
    assert spec is not None
    return spec


IMPOSSIBLE = [
    "a@" + ".".join(["ü" * 60] * 4),  # labels past 63 once in ASCII, domain past 253
    "a@" + ".".join(["ñandú"] * 40) + ".com",  # 40 IDN labels: past 253 once in ASCII
    "a" * 65 + "@example.com",  # local part past 64 octets
    "ü" * 33 + "@example.com",  # 66 octets of UTF-8
    "a@" + "x" * 64 + ".com",  # a label of 64
    "a@" + ".".join(["x" * 60] * 5),  # 304 characters of domain
]


@pytest.mark.parametrize("address", IMPOSSIBLE)
def test_an_address_past_the_rfc_limits_never_reaches_email_validator(checked, address):
    with pytest.raises(InvalidLead) as refused:
        _spec(1).apply({"e0": address})
    assert refused.value.fields == {"e0": "must be an e-mail address"}
    assert checked == []


def test_100_email_fields_of_long_internationalised_domains_hand_the_library_a_bounded_amount(checked):
    domain = "ü" * 50 + "." + "ñ" * 50 + ".de"  # possible by the limits: only the library can tell
    lead = {f"e{i}": f"a{i}@{domain}" for i in range(100)}
    with pytest.raises(InvalidLead) as refused:
        _spec(100).apply(lead)
    assert len(refused.value.fields) > 90  # the first few are valid addresses
    work = sum(quality._email_work(text) for text in checked)
    assert work <= quality.MAX_EMAIL_WORK
    assert len(checked) < 10  # of 100


def test_100_ordinary_addresses_and_an_internationalised_one_still_pass(checked):
    lead = {f"e{i}": f"Person.{i}@Example.com" for i in range(99)} | {"e99": "ada@bücher.de"}
    normal = _spec(100).apply(lead)
    assert normal["e0"] == "person.0@example.com"
    assert normal["e99"] == "ada@bücher.de"
    assert len(checked) == 100
