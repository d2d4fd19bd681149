"""The peewee models agree with sql/*.sql on MySQL/MariaDB: columns, types, nullability, unique keys."""

from __future__ import annotations

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
