"""storage/records/fastsql.py: a row it inserts reads back as peewee's own insert would have stored it
(defaults filled, values through each field's db_value), and a duplicate key is the same
IntegrityError; on the run's database (MariaDB when reachable, else SQLite)."""

from __future__ import annotations

from datetime import datetime

import peewee as pw
import pytest

from webhooks.payments.states import PaymentStatus
from webhooks.storage.records import fastsql
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Payment


def payment(reference: str) -> dict:
    return {
        "provider": "paystack",
        "reference": reference,
        "amount_minor": 1_250_000,
        "currency": "NGN",
        "customer": "ada@example.com",
        "status": PaymentStatus.CREDITED,
        "event_type": "charge.success",
        "received_at": datetime(2026, 12, 2, 3, 4, 5, 678901),
        "credited_at": None,
        "payer": "ada@example.com",
        "fees_minor": 0,
        "flag": None,
    }


def columns(row: Payment) -> dict:
    return {f.name: getattr(row, f.name) for f in Payment._meta.sorted_fields if f.name != "id"}


def test_a_row_reads_back_as_peewees_insert_stores_it_and_a_duplicate_is_refused(database_url):
    with db.connection_context():
        Payment.insert(**payment("peewee")).execute()
        fastsql.insert(Payment, payment("fast"))
        theirs = columns(Payment.get(Payment.reference == "peewee"))
        ours = columns(Payment.get(Payment.reference == "fast"))
        assert ours == {**theirs, "reference": "fast"}
        assert ours["refunded_minor"] == 0 and ours["source"] == "webhook"  # the model's defaults
        with pytest.raises(pw.IntegrityError), db.atomic():
            fastsql.insert(Payment, payment("fast"))


def test_rows_inserted_together_read_back_as_peewees_insert_many_stores_them(database_url):
    """Rows that leave out different fields: each takes the model's default, else NULL."""
    short = {k: v for k, v in payment("").items() if k not in ("flag", "credited_at", "fees_minor")}
    rows = [payment("many-0"), {**short, "reference": "many-1"}, {**payment("many-2"), "flag": "partial"}]
    with db.connection_context():
        Payment.insert_many([{**r, "reference": "peewee-" + r["reference"]} for r in rows]).execute()
        fastsql.insert_many(Payment, rows)
        for r in rows:
            theirs = columns(Payment.get(Payment.reference == "peewee-" + r["reference"]))
            assert columns(Payment.get(Payment.reference == r["reference"])) == {**theirs, "reference": r["reference"]}
        assert columns(Payment.get(Payment.reference == "many-1"))["fees_minor"] == 0  # the default
        with pytest.raises(ValueError, match="no_such_field"):
            fastsql.insert_many(Payment, [{**payment("many-3"), "no_such_field": 1}])
