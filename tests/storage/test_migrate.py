"""The peewee models agree with sql/*.sql on MySQL/MariaDB: columns, types, nullability, unique keys."""

from __future__ import annotations

import json
import re

import peewee as pw
import pytest

from webhooks.storage import models
from webhooks.storage.db import db, is_mysql
from webhooks.storage.migrate import upgrade


def expected_type(field: pw.Field) -> str:
    if isinstance(field, models.DateTime6Field):
        return "datetime(6)"
    if isinstance(field, models.MediumTextField):
        return "mediumtext"
    if isinstance(field, models.MediumBlobField):
        return "mediumblob"
    if isinstance(field, pw.CharField):
        return f"varchar({field.max_length})"
    if isinstance(field, pw.DecimalField):
        return f"decimal({field.max_digits},{field.decimal_places})"
    if isinstance(field, pw.BooleanField):
        return "tinyint(1)"
    if isinstance(field, (pw.BigAutoField, pw.BigIntegerField)):
        return "bigint"
    if isinstance(field, pw.SmallIntegerField):
        return "smallint"
    if isinstance(field, pw.IntegerField):
        return "int"
    if isinstance(field, pw.TextField):
        return "text"
    raise AssertionError(f"no MySQL type known for {field!r}")


def normalise(column_type: str) -> str:
    column_type = column_type.lower()
    return re.sub(r"^(bigint|int|smallint)\(\d+\)", r"\1", column_type)


@pytest.fixture
def mysql(database_url):
    if not is_mysql():
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306)")
    return database_url


def test_models_agree_with_the_ddl(mysql):
    with db.connection_context():
        schema = db.execute_sql("SELECT DATABASE()").fetchone()[0]
        for model in models.ALL_MODELS:
            table = model._meta.table_name
            cols = {
                name: (normalise(ctype), nullable == "YES")
                for name, ctype, nullable in db.execute_sql(
                    "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS"
                    " WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s",
                    (schema, table),
                )
            }
            want = {f.column_name: (expected_type(f), f.null) for f in model._meta.sorted_fields}
            assert cols == want, table
            uniques = {}
            for index, column, seq in db.execute_sql(
                "SELECT INDEX_NAME, COLUMN_NAME, SEQ_IN_INDEX FROM information_schema.STATISTICS"
                " WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s AND NON_UNIQUE=0",
                (schema, table),
            ):
                uniques.setdefault(index, []).append((seq, column))
            got = {tuple(c for _, c in sorted(cols_)) for cols_ in uniques.values()}
            expect = {(model._meta.primary_key.column_name,)}
            expect |= {(f.column_name,) for f in model._meta.sorted_fields if f.unique}
            expect |= {tuple(cols_) for cols_, unique in model._meta.indexes if unique}
            assert got == expect, table


def test_upgrade_is_idempotent(database_url):
    assert upgrade(echo=lambda _m: None) == []
    with db.connection_context():
        assert models.SchemaMigration.select().count() >= 1


def test_011_carries_the_payment_events_outbox_over_with_its_webhook_ids(mysql):
    """Events of the single-URL outbox (sql/004) keep their ids and state as deliveries to the
    endpoint PAYMENT_EVENTS_URL configures; running the migration again changes nothing."""
    from webhooks.storage.migrate import SQL_DIR, split_statements

    at = models.utcnow()
    legacy = [
        ("msg_old1", "wallet.credited", "ps-1", "delivered", 1, at),
        ("msg_old2", "wallet.debited", "rf-1", "failed", 9, None),
        ("msg_old3", "wallet.credited", "ps-2", "pending", 0, None),
    ]
    carry = [s for s in split_statements((SQL_DIR / "011_event_endpoints.sql").read_text()) if s.startswith("INSERT")]
    with db.connection_context():
        for event_id, kind, reference, status, attempts, delivered_at in legacy:
            models.PaymentEvent.insert(
                event_id=event_id,
                type=kind,
                provider="paystack",
                reference=reference,
                customer="ada@example.com",
                body=json.dumps({"type": kind, "data": {"reference": reference}}),
                status=status,
                attempts=attempts,
                created_at=at,
                next_attempt_at=at,
                delivered_at=delivered_at,
            ).execute()
        for _ in range(2):
            for statement in carry:
                db.execute_sql(statement)
        events = {e.event_id: e for e in models.Event.select()}
        deliveries = list(models.EventDelivery.select().order_by(models.EventDelivery.id))
        endpoint = models.EventEndpoint.get_by_id("payment-events-url")
    assert sorted(events) == ["msg_old1", "msg_old2", "msg_old3"]
    assert {e.subject for e in events.values()} == {"paystack:ps-1", "paystack:rf-1", "paystack:ps-2"}
    assert all(e.fanned_out and e.entity == "ada@example.com" for e in events.values())
    assert [(d.webhook_id, d.status, d.attempts, d.endpoint_id) for d in deliveries] == [
        ("msg_old1", "delivered", 1, "payment-events-url"),
        ("msg_old2", "failed", 9, "payment-events-url"),
        ("msg_old3", "pending", 0, "payment-events-url"),
    ]
    assert endpoint.secret is None and json.loads(endpoint.types) == ["wallet.credited", "wallet.debited"]
