"""The peewee models agree with sql/*.sql on MySQL/MariaDB: columns, types, nullability, unique keys."""

from __future__ import annotations

import json
import re

import peewee as pw
import pytest

from testkit.servers import create_mysql_db, mysql_admin_url
from webhooks.storage.records import models
from webhooks.storage.records.db import db, is_mysql, make_database
from webhooks.storage.records.migrate import (
    _MIGRATIONS_DDL,
    SQL_DIR,
    migration_files,
    split_statements,
    table_renames,
    upgrade,
)


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


def test_every_table_is_innodb_with_a_primary_key_as_galera_replicates_only_those(mysql):
    """Galera replicates InnoDB tables by their rows' primary keys: a table without one (or of
    another engine) would be written on the writing node alone, or slowly (docs/cluster.md)."""
    with db.connection_context():
        found = db.execute_sql(
            "SELECT t.TABLE_NAME, t.ENGINE, c.CONSTRAINT_NAME FROM information_schema.TABLES t"
            " LEFT JOIN information_schema.TABLE_CONSTRAINTS c ON c.TABLE_SCHEMA = t.TABLE_SCHEMA"
            " AND c.TABLE_NAME = t.TABLE_NAME AND c.CONSTRAINT_TYPE = 'PRIMARY KEY'"
            " WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_TYPE = 'BASE TABLE'"
        ).fetchall()
    assert {name for name, _, _ in found} >= {m._meta.table_name for m in models.ALL_MODELS}
    assert [(name, engine, pk) for name, engine, pk in found if engine != "InnoDB" or pk is None] == []


def test_upgrade_is_idempotent(database_url):
    assert upgrade(echo=lambda _m: None) == []
    with db.connection_context():
        assert models.SchemaMigration.select().count() >= 1


# The tables sql/014 renamed: {new name: old name}, read from the migration itself.
RENAMED = {
    new: old
    for statement in split_statements((SQL_DIR / "014_one_word_per_concept.sql").read_text())
    for old, new in table_renames(statement)
}


def as_before_014(model: type[models.BaseModel]) -> type[models.BaseModel]:
    """`model` under its table's name of before sql/014 (its indexes named as peewee named them)."""
    table = RENAMED.get(model._meta.table_name, model._meta.table_name)
    return type(model.__name__, (model,), {"Meta": type("Meta", (), {"table_name": table})})


@pytest.fixture(params=["mysql", "sqlite"])
def ledger_at_013(request, tmp_path, database_url):
    """The database proxy bound, for the test, to a new database of this run's kind (or SQLite)
    whose schema is that of sql/001..013: what a deployment had before sql/014."""
    admin = mysql_admin_url() if request.param == "mysql" else None
    if request.param == "mysql" and not admin:
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306)")
    url, drop = create_mysql_db(admin) if admin else (f"sqlite:///{tmp_path / 'ledger.sqlite3'}", lambda: None)
    session, database = db.obj, make_database(url, pool_size=2)
    db.initialize(database)
    try:
        with db.connection_context():
            before = [p for p in migration_files() if p.name < "014"]
            if is_mysql():
                db.execute_sql(_MIGRATIONS_DDL)
                for path in before:
                    for statement in split_statements(path.read_text()):
                        db.execute_sql(statement)
            else:  # what upgrade() made of a SQLite file then: the models, under the old names
                db.create_tables([as_before_014(m) for m in models.ALL_MODELS])
            for path in before:
                models.SchemaMigration.insert(version=path.name.split("_", 1)[0]).execute()
        yield request.param
    finally:
        if is_mysql():
            database.close_all()
        else:
            database.close()
        db.initialize(session)
        drop()


def index_names(table: str) -> set[str]:
    if is_mysql():
        return {
            name
            for (name,) in db.execute_sql(
                "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS"
                " WHERE TABLE_SCHEMA=DATABASE() AND TABLE_NAME=%s AND INDEX_NAME<>'PRIMARY'",
                (table,),
            )
        }
    return {index.name for index in db.get_indexes(table) if index.sql}


def test_014_renames_the_two_tables_and_keeps_their_rows_and_indexes(ledger_at_013):
    """A ledger of before sql/014 with rows in both tables: upgrade() renames the tables, the
    rows stay with their ids, the unique keys still refuse a repeat, new ids follow the old."""
    assert set(RENAMED) == {models.WebhookCall._meta.table_name, models.EventDispatch._meta.table_name}
    OldCall, OldDispatch = as_before_014(models.WebhookCall), as_before_014(models.EventDispatch)
    at = models.utcnow()
    with db.connection_context():
        indexes_before = {new: index_names(old) for new, old in RENAMED.items()}
        for n in (1, 2):
            OldCall.insert(
                provider="paystack",
                reference=f"ps-{n}",
                event_type="charge.success",
                verdict="credited",
                status_code=200,
                headers="{}",
                body=b'{"event": "charge.success"}',
                received_at=at,
            ).execute()
        event = models.Event.insert(
            event_id="msg_1",
            type="wallet.credited",
            subject="paystack:ps-1",
            entity="ada@example.com",
            body="{}",
            created_at=at,
        ).execute()
        for endpoint, status in (("a", "delivered"), ("b", "pending")):
            OldDispatch.insert(
                event=event,
                endpoint_id=endpoint,
                entity="ada@example.com",
                webhook_id="msg_1",
                status=status,
                attempts=1,
                created_at=at,
                next_attempt_at=at,
            ).execute()

    later = [path.name[:3] for path in migration_files() if path.name[:3] >= "014"]  # 014 and every one after it
    assert later[:6] == ["014", "015", "016", "017", "018", "019"]
    assert upgrade(echo=lambda _m: None) == later
    assert upgrade(echo=lambda _m: None) == []

    with db.connection_context():
        tables = set(db.get_tables())
        assert set(RENAMED) <= tables and not tables & set(RENAMED.values())
        calls = list(models.WebhookCall.select().order_by(models.WebhookCall.id))
        assert [(c.id, c.reference, c.verdict, bytes(c.body)) for c in calls] == [
            (1, "ps-1", "credited", b'{"event": "charge.success"}'),
            (2, "ps-2", "credited", b'{"event": "charge.success"}'),
        ]
        dispatches = list(models.EventDispatch.select().order_by(models.EventDispatch.id))
        assert [(d.id, d.event, d.endpoint_id, d.status) for d in dispatches] == [
            (1, event, "a", "delivered"),
            (2, event, "b", "pending"),
        ]
        if ledger_at_013 == "mysql":  # table names only: the indexes keep theirs
            assert {t: index_names(t) for t in RENAMED} == indexes_before
        else:  # made again by the models, under the new table's name
            assert {t: index_names(t) for t in RENAMED} == {
                m._meta.table_name: {i._name for i in m._meta.fields_to_index()}
                for m in (models.WebhookCall, models.EventDispatch)
            }
        with pytest.raises(pw.IntegrityError), db.atomic():
            models.EventDispatch.insert(
                event=event,
                endpoint_id="a",
                entity="ada@example.com",
                webhook_id="msg_1",
                status="pending",
                created_at=at,
                next_attempt_at=at,
            ).execute()
        assert (
            models.WebhookCall.insert(
                provider="paystack",
                reference="ps-3",
                verdict="credited",
                status_code=200,
                headers="{}",
                body=b"",
            ).execute()
            == 3
        )
        if ledger_at_013 == "mysql":  # the release before 014, still running, writes by the old names
            assert (
                OldCall.insert(
                    provider="paystack", reference="ps-4", verdict="credited", status_code=200, headers="{}", body=b""
                ).execute()
                == 4
            )
            assert models.WebhookCall.get_by_id(4).reference == "ps-4"
            OldDispatch.update(status="delivered").where(OldDispatch.id == 2).execute()
            assert models.EventDispatch.get_by_id(2).status == "delivered"


@pytest.mark.parametrize("ledger_at_013", ["mysql"], indirect=True)  # SQL that runs on MySQL/MariaDB only
def test_011_carries_the_payment_events_outbox_over_with_its_webhook_ids(ledger_at_013):
    """Events of the single-URL outbox (sql/004) keep their ids and state as dispatches to the
    endpoint PAYMENT_EVENTS_URL configures; running the migration again changes nothing."""
    at = models.utcnow()
    legacy = [
        ("msg_old1", "wallet.credited", "ps-1", "delivered", 1, at),
        ("msg_old2", "wallet.debited", "rf-1", "failed", 9, None),
        ("msg_old3", "wallet.credited", "ps-2", "pending", 0, None),
    ]
    carry = [s for s in split_statements((SQL_DIR / "011_event_endpoints.sql").read_text()) if s.startswith("INSERT")]
    with db.connection_context():
        for event_id, kind, reference, status, attempts, delivered_at in legacy:
            models.LegacyPaymentEvent.insert(
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
        Dispatch = as_before_014(models.EventDispatch)
        dispatches = list(Dispatch.select().order_by(Dispatch.id))
        endpoint = models.EventEndpoint.get_by_id("payment-events-url")
    assert sorted(events) == ["msg_old1", "msg_old2", "msg_old3"]
    assert {e.subject for e in events.values()} == {"paystack:ps-1", "paystack:rf-1", "paystack:ps-2"}
    assert all(e.fanned_out and e.entity == "ada@example.com" for e in events.values())
    assert [(d.webhook_id, d.status, d.attempts, d.endpoint_id) for d in dispatches] == [
        ("msg_old1", "delivered", 1, "payment-events-url"),
        ("msg_old2", "failed", 9, "payment-events-url"),
        ("msg_old3", "pending", 0, "payment-events-url"),
    ]
    assert endpoint.secret is None and json.loads(endpoint.types) == ["wallet.credited", "wallet.debited"]
