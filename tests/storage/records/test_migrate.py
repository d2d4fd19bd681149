"""The peewee models agree with sql/*.sql on MySQL/MariaDB: columns, types, nullability, unique keys."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

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
    if isinstance(field, pw.DateField):
        return "date"
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


@contextmanager
def ledger_before(kind: str, tmp_path, version: str, sqlite_models: list) -> Iterator[str]:
    """The database proxy bound, for a test, to a new database of `kind` ("mysql", or SQLite)
    whose schema is that of the migrations before `version`: what a deployment had then. On
    SQLite, what upgrade() made of a file then: `sqlite_models`."""
    admin = mysql_admin_url() if kind == "mysql" else None
    if kind == "mysql" and not admin:
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306)")
    url, drop = create_mysql_db(admin) if admin else (f"sqlite:///{tmp_path / 'ledger.sqlite3'}", lambda: None)
    session, database = db.obj, make_database(url, pool_size=2)
    db.initialize(database)
    try:
        with db.connection_context():
            before = [p for p in migration_files() if p.name < version]
            if is_mysql():
                db.execute_sql(_MIGRATIONS_DDL)
                for path in before:
                    for statement in split_statements(path.read_text()):
                        db.execute_sql(statement)
            else:
                db.create_tables(sqlite_models)
            for path in before:
                models.SchemaMigration.insert(version=path.name.split("_", 1)[0]).execute()
        yield kind
    finally:
        if is_mysql():
            database.close_all()
        else:
            database.close()
        db.initialize(session)
        drop()


@pytest.fixture(params=["mysql", "sqlite"])
def ledger_at_013(request, tmp_path, database_url):
    """A new database at the schema of sql/001..013: what a deployment had before sql/014 (on
    SQLite the models under their old names)."""
    with ledger_before(request.param, tmp_path, "014", [as_before_014(m) for m in models.ALL_MODELS]) as kind:
        yield kind


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


@pytest.fixture(params=["mysql", "sqlite"])
def ledger_at_021(request, tmp_path, database_url):
    """A new database at the schema of sql/001..021: the release before sales were records of
    their own (sql/022)."""
    had = [m for m in models.ALL_MODELS if m not in (models.Sale, models.LeadReturn)]
    with ledger_before(request.param, tmp_path, "022", had) as kind:
        yield kind


def test_022_makes_one_sale_of_every_lead_sold_or_returned_before_it(ledger_at_021):
    """Leads as the release before wrote them (the sale in the lead's columns): upgrade() makes
    one sale per sold or returned lead, with those columns; none for unsold or test leads; the
    copy run again adds nothing."""
    sold_at, settled = datetime(2026, 11, 30, 10, 0, 0, 123456), datetime(2026, 11, 30, 10, 0, 1)
    rows = [
        ("s1", "sold", "acme", "20.00", "2.00", None, None, ("acme@example.com|NGN", 2000)),
        ("s2", "sold", "zeta", "12.50", None, None, None, None),
        ("r1", "returned", "acme", "20.00", "2.00", datetime(2026, 12, 1, 9, 0), "bad phone", None),
        ("u1", "unsold", None, None, None, None, None, None),
        ("t1", "test_sold", "acme", "20.00", "2.00", None, None, None),
    ]
    with db.connection_context():
        for lead_id, status, buyer, price, payout, returned_at, reason, charge in rows:
            models.Lead.insert(
                publisher_id="surge",
                lead_id=lead_id,
                status=status,
                buyer_id=buyer,
                price=price,
                payout=payout,
                payload="{}",
                received_at=sold_at,
                sold_at=sold_at if buyer else None,
                settled_at=settled,
                lease_id=f"lease-{lead_id}" if buyer else None,
                reserved_us=1_700_000_000_000_000 if buyer else None,
                returned_at=returned_at,
                return_reason=reason,
                charge_account=charge[0] if charge else None,
                charge_minor=charge[1] if charge else None,
            ).execute()

    assert "022" in upgrade(echo=lambda _m: None)
    with db.connection_context():
        copy = [s for s in split_statements((SQL_DIR / "022_sales.sql").read_text()) if s.startswith("INSERT")]
        assert len(copy) == 1  # one statement
        db.execute_sql(copy[0])  # run twice: no duplicate
        sales = {
            s.lead_id: (
                s.buyer_id,
                f"{s.price:.2f}",
                None if s.payout is None else f"{s.payout:.2f}",
                s.status,
                s.sold_at,
                s.returned_at,
                s.return_reason,
                s.charge_account,
                s.charge_minor,
                s.lease_id,
                s.reserved_us,
            )
            for s in models.Sale.select()
        }
        assert models.Sale.select().count() == 3
    stamp = 1_700_000_000_000_000
    assert sales == {
        "s1": ("acme", "20.00", "2.00", "sold", sold_at, None, None, "acme@example.com|NGN", 2000, "lease-s1", stamp),
        "s2": ("zeta", "12.50", None, "sold", sold_at, None, None, None, None, "lease-s2", stamp),
        "r1": (
            "acme",
            "20.00",
            "2.00",
            "returned",
            sold_at,
            datetime(2026, 12, 1, 9, 0),
            "bad phone",
            None,
            None,
            "lease-r1",
            stamp,
        ),
    }
    with db.connection_context(), pytest.raises(pw.IntegrityError), db.atomic():  # no buyer buys a lead twice
        models.Sale.insert(
            publisher_id="surge", lead_id="s1", buyer_id="acme", price="1.00", status="sold", sold_at=sold_at
        ).execute()


@pytest.fixture
def ledger_at_023(tmp_path, database_url):
    """A new MySQL/MariaDB database at the schema of sql/001..023: the release before payout
    holds (sql/024). On SQLite, upgrade() adds the columns the models gained (their defaults:
    no hold, payable), as it does for every migration."""
    admin = mysql_admin_url()
    if not admin:
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306)")
    url, drop = create_mysql_db(admin)
    session, database = db.obj, make_database(url, pool_size=2)
    db.initialize(database)
    try:
        with db.connection_context():
            before = [p for p in migration_files() if p.name < "024"]
            db.execute_sql(_MIGRATIONS_DDL)
            for path in before:
                for statement in split_statements(path.read_text()):
                    db.execute_sql(statement)
            for path in before:
                models.SchemaMigration.insert(version=path.name.split("_", 1)[0]).execute()
        yield
    finally:
        database.close_all()
        db.initialize(session)
        drop()


def test_024_makes_every_sale_before_it_payable_and_holds_nothing(ledger_at_023):
    """A publisher and its sales as the release before wrote them (every payout credited to the
    balance at sale, a return's taken back): after upgrade() the publisher holds nothing for
    0 days, every sale is payable with no hold's end, and a returned one is an adjustment."""
    sold_at = datetime(2026, 11, 30, 10, 0, 0, 123456)
    with db.connection_context():
        db.execute_sql(
            "INSERT INTO publishers (id, name, api_key_hash, api_key_hint, commission_pct, active, balance,"
            " created_at, updated_at, routing, mode) VALUES ('surge', 'Surge', 'h', 'hint', 10, 1, 2.00,"
            " '2026-11-01', '2026-11-01', 'waterfall', 'live')"
        )
        for lead_id, status, returned_at in (("s1", "sold", None), ("r1", "returned", "2026-12-01 09:00:00")):
            db.execute_sql(
                "INSERT INTO sales (publisher_id, lead_id, buyer_id, price, payout, status, sold_at, returned_at)"
                " VALUES ('surge', %s, 'acme', 20.00, 2.00, %s, %s, %s)",
                (lead_id, status, sold_at, returned_at),
            )
    assert "024" in upgrade(echo=lambda _m: None)
    with db.connection_context():
        publisher = models.Publisher.get_by_id("surge")
        assert (publisher.payout_hold_days, f"{publisher.payout_held:.2f}", f"{publisher.balance:.2f}") == (
            0,
            "0.00",
            "2.00",
        )
        sales = {s.lead_id: (s.status, s.payout_state, s.payable_at) for s in models.Sale.select()}
    assert sales == {"s1": ("sold", "payable", None), "r1": ("returned", "payable", None)}
    assert upgrade(echo=lambda _m: None) == []  # once


@pytest.fixture(params=["mysql", "sqlite"])
def ledger_at_024(request, tmp_path, database_url):
    """A new database at the schema of sql/001..024: the release before shared leads (sql/025).
    On SQLite, the tables as upgrade() makes them, the report's `sales` not yet counted."""
    with ledger_before(request.param, tmp_path, "025", list(models.ALL_MODELS)) as kind:
        yield kind


def test_025_counts_every_sold_lead_before_it_as_one_sale_and_sells_exclusively(ledger_at_024):
    """The report's hours as the release before counted them (a sold lead, one sale): after
    upgrade() each row's `sales` is its `sold`, and (MySQL, whose columns the migration adds) a
    publisher of then sells each lead once."""
    hour = datetime(2026, 11, 30, 10)
    mark = "%s" if is_mysql() else "?"
    with db.connection_context():
        if is_mysql():
            db.execute_sql(
                "INSERT INTO publishers (id, name, api_key_hash, api_key_hint, commission_pct, active, balance,"
                " created_at, updated_at, routing, mode) VALUES ('surge', 'Surge', 'h', 'hint', 10, 1, 0,"
                " '2026-11-01', '2026-11-01', 'waterfall', 'live')"
            )
        for buyer_id, leads, sold in (("acme", 5, 4), ("", 3, 0)):
            db.execute_sql(
                "INSERT INTO lead_stats (hour, publisher_id, buyer_id, leads, sold, returned, revenue, payout)"
                f" VALUES ({mark}, 'surge', {mark}, {mark}, {mark}, 0, 40.00, 4.00)",
                (hour, buyer_id, leads, sold),
            )
    assert "025" in upgrade(echo=lambda _m: None)
    with db.connection_context():
        if is_mysql():
            assert models.Publisher.get_by_id("surge").max_sales == 1
        rows = {r.buyer_id: (r.sold, r.sales) for r in models.LeadStats.select()}
    assert rows == {"acme": (4, 4), "": (0, 0)}
    assert upgrade(echo=lambda _m: None) == []  # once


@pytest.fixture(params=["mysql", "sqlite"])
def ledger_at_025(request, tmp_path, database_url):
    """A new database at the schema of sql/001..025: the release before feedback and the
    report's offers (sql/026). On SQLite, the tables as upgrade() makes them, the offers not
    yet counted (the columns' default)."""
    with ledger_before(request.param, tmp_path, "026", list(models.ALL_MODELS)) as kind:
        yield kind


def test_026_counts_every_sale_before_it_as_an_accepted_offer_and_keys_feedback_by_buyer_id(ledger_at_025):
    """The report's hours as the release before counted them (no offers): after upgrade() each
    row's offers and accepted are its sales, no conversion; a buyer's feedback id is stored once."""
    hour = datetime(2026, 11, 30, 10)
    mark = "%s" if is_mysql() else "?"
    with db.connection_context():
        for buyer_id, leads, sold, sales in (("acme", 5, 4, 4), ("zeta", 0, 0, 2), ("", 3, 0, 0)):
            db.execute_sql(
                "INSERT INTO lead_stats (hour, publisher_id, buyer_id, leads, sold, returned, revenue, payout, sales)"
                f" VALUES ({mark}, 'surge', {mark}, {mark}, {mark}, 0, 40.00, 4.00, {mark})",
                (hour, buyer_id, leads, sold, sales),
            )
    assert "026" in upgrade(echo=lambda _m: None)
    with db.connection_context():
        rows = {r.buyer_id: (r.sales, r.offers, r.accepted, r.conversions) for r in models.LeadStats.select()}
        feedback = dict(
            buyer_id="acme",
            feedback_id="crm-1",
            sale_id=1,
            publisher_id="surge",
            lead_id="s1",
            event="converted",
            value="120.00",
            created_at=models.utcnow(),
        )
        models.Feedback.insert(**feedback).execute()
        with pytest.raises(pw.IntegrityError), db.atomic():  # one feedback per buyer and id
            models.Feedback.insert(**{**feedback, "event": "bad"}).execute()
        models.Feedback.insert(**{**feedback, "buyer_id": "zeta"}).execute()  # the id is the buyer's own
        assert models.Feedback.select().count() == 2
    assert rows == {"acme": (4, 4, 4, 0), "zeta": (2, 2, 2, 0), "": (0, 0, 0, 0)}
    assert upgrade(echo=lambda _m: None) == []  # once


@pytest.fixture(params=["mysql", "sqlite"])
def ledger_at_033(request, tmp_path, database_url):
    """A new database at the schema of sql/001..033: the release before the report's days
    (sql/034). On SQLite, the tables as upgrade() made them then: no lead_stats_days."""
    before = [m for m in models.ALL_MODELS if m is not models.LeadStatsDay]
    with ledger_before(request.param, tmp_path, "034", before) as kind:
        yield kind


def test_034_adds_up_the_hours_before_it_into_their_days(ledger_at_033):
    """The report's hours of two days as the release before kept them (one with its sales not
    yet counted: NULL): after upgrade() each (day, publisher, buyer) row is the sum of its hours."""
    mark = "%s" if is_mysql() else "?"
    hours = (
        (datetime(2026, 11, 30, 0), "acme", 5, 4, 1, "40.00", "4.00", 4, 6, 4, 1),
        (datetime(2026, 11, 30, 23), "acme", 2, 1, 0, "10.50", "1.05", None, 3, 1, 0),
        (datetime(2026, 11, 30, 23), "", 3, 0, 0, "0.00", "0.00", 0, 0, 0, 0),
        (datetime(2026, 12, 1, 0), "acme", 1, 1, 0, "10.00", "1.00", 1, 1, 1, 1),
    )
    with db.connection_context():
        for row in hours:
            db.execute_sql(
                "INSERT INTO lead_stats (hour, publisher_id, buyer_id, leads, sold, returned, revenue, payout, sales,"
                f" offers, accepted, conversions) VALUES ({mark}, 'surge', {', '.join([mark] * 10)})",
                row,
            )
    assert "034" in upgrade(echo=lambda _m: None)
    with db.connection_context():
        days = {
            (str(r.day), r.buyer_id): (r.leads, r.sold, r.returned, f"{r.revenue:.2f}", f"{r.payout:.2f}", r.sales)
            + (r.offers, r.accepted, r.conversions)
            for r in models.LeadStatsDay.select().where(models.LeadStatsDay.publisher_id == "surge")
        }
    assert days == {
        ("2026-11-30", "acme"): (7, 5, 1, "50.50", "5.05", 4, 9, 5, 1),
        ("2026-11-30", ""): (3, 0, 0, "0.00", "0.00", 0, 0, 0, 0),
        ("2026-12-01", "acme"): (1, 1, 0, "10.00", "1.00", 1, 1, 1, 1),
    }
    assert upgrade(echo=lambda _m: None) == []  # once


def test_a_sqlite_ledger_gains_its_new_columns_before_their_indexes(tmp_path, database_url):
    """A SQLite ledger file made before sql/030 (no lookup digests on leads): upgrade() adds the
    columns first, then their indexes, so the file stays sound (SQLite would otherwise index the
    text "email_digest" for every row, and keep those entries once the column exists)."""
    with ledger_before("sqlite", tmp_path, "030", models.ALL_MODELS):
        with db.connection_context():
            for index in ("leads_email_digest", "leads_phone_digest"):
                db.execute_sql(f'DROP INDEX "{index}"')
            for column in ("email_digest", "phone_digest"):
                db.execute_sql(f'ALTER TABLE leads DROP COLUMN "{column}"')
            db.execute_sql(
                "INSERT INTO leads (publisher_id, lead_id, status, payload, received_at, settled_at)"
                " VALUES ('surge', 'old-1', 'unsold', '{}', '2026-11-01 00:00:00', '2026-11-01 00:00:00')"
            )
        upgrade(echo=lambda _m: None)
        with db.connection_context():
            assert db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]
            indexed = {i.name: i.columns for i in db.get_indexes("leads")}
            assert indexed["leads_email_digest"] == ["email_digest"]
            models.Lead.update(email_digest="d" * 32).where(models.Lead.lead_id == "old-1").execute()
            assert db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]
            found = models.Lead.select().where(models.Lead.email_digest == "d" * 32)
            assert [lead.lead_id for lead in found] == ["old-1"]
