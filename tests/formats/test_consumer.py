"""The one normaliser of a consumer's phone or e-mail (docs/api.md "Fifth round: the seams"):
every spelling of one consumer is one key; what is not a string is refused; any length is
read in one pass."""

from __future__ import annotations

import pytest

from webhooks.formats import consumer

PHONE = "+15125550111"
PHONE_SPELLINGS = [
    "+15125550111",
    "001 512 555 0111",  # the international prefix most of the world dials
    "011 1 512 555 0111",  # the US one
    "+1 512 555 0111#",  # a closing hash
    "+1 512 555 0111 ##",
    "(512) 555-0111",
    "1-512-555-0111",
    "512.555.0111 ext. 42",  # an extension: the same consumer
    "512-555-0111 x7",
    "+15125550111\u200b",  # a trailing zero-width space (Unicode Cf)
    "\ufeff+1 512\u200d 555 0111",
    "\u202a+15125550111\u202c",  # bidi embedding marks
    " +15125550111\n",
    "＋１ ５１２ ５５５ ０１１１",  # fullwidth digits
]
EMAIL = "victim@example.com"
EMAIL_SPELLINGS = [
    "victim@example.com",
    "victim@example.com.",  # the root's dot of a fully qualified domain
    '"victim"@example.com',  # a quoted local part
    '"vic\\tim"@example.com',  # a quoted pair
    "Victim@Example.COM",
    "  victim@example.com\t\n",
    "victim@example.com\u200b",
    "\u200bvic\u200ctim@exam\u2060ple.com",
    "\ufeffVICTIM@EXAMPLE.COM.",
]


@pytest.mark.parametrize("spelled", PHONE_SPELLINGS)
def test_every_spelling_of_a_phone_is_one_key(spelled):
    assert consumer.key("phone", spelled) == PHONE


@pytest.mark.parametrize("spelled", EMAIL_SPELLINGS)
def test_every_spelling_of_an_email_is_one_key(spelled):
    assert consumer.key("email", spelled) == EMAIL


def test_a_phone_is_read_in_the_field_specs_region():
    assert consumer.key("phone", "020 7946 0958", "GB") == "+442079460958"
    assert consumer.key("phone", "0113 496 0000", "GB") == "+441134960000"  # 011 is a UK area code there
    assert consumer.key("phone", "0044 20 7946 0958") == "+442079460958"  # 00 from a US default too
    assert consumer.key("phone", "+44 20 7946 0958", "US") == "+442079460958"


@pytest.mark.parametrize("value", ["", "   ", "\u200b", "abc", "12", "+", "#", "00"])
def test_no_number_is_no_key(value):
    assert consumer.key("phone", value) is None


@pytest.mark.parametrize("value", ["", "victim", "@example.com", "victim@", "victim@.", '""@example.com'])
def test_no_address_is_no_key(value):
    assert consumer.key("email", value) is None


@pytest.mark.parametrize("value", [["+15125550111"], 15125550111, 1.5, True, {"n": "+15125550111"}, [[[[]]]]])
@pytest.mark.parametrize("field", consumer.FIELDS)
def test_a_value_that_is_not_a_string_is_refused(field, value):
    with pytest.raises(consumer.NotAConsumerValue, match="must be a string"):
        consumer.key(field, value)
    with pytest.raises(consumer.InvalidConsumerFields) as refused:
        consumer.keys_of({field: value, "other": [1]}, [field], {})  # only the fields checked
    assert refused.value.fields == {field: "must be a string"}


def test_an_absent_value_is_no_key_and_a_stored_lead_never_raises():
    assert consumer.keys_of({}, consumer.FIELDS, {}) == {"email": None, "phone": None}
    assert consumer.stored_keys_of({"phone": 15125550111, "email": "Victim@Example.com"}, consumer.FIELDS) == {
        "phone": None,
        "email": EMAIL,
    }


def test_a_256_kib_value_is_refused_or_read_through_its_padding():
    """Padding of spaces or format characters around a listed consumer cannot hide it; a
    value still too long after it is refused (not ignored: ignored, it would pass every list)."""
    big = 256 * 1024
    assert consumer.key("phone", " " * big + PHONE) == PHONE
    assert consumer.key("email", "\u200b" * big + EMAIL + "\t" * big) == EMAIL
    for field in consumer.FIELDS:
        with pytest.raises(consumer.NotAConsumerValue, match="at most"):
            consumer.key(field, "9" * big)
        with pytest.raises(consumer.NotAConsumerValue, match="at most"):
            consumer.key(field, "a@" + "b" * big)
