"""Apply sql/NNN_*.sql in order, once each, recording versions in schema_migrations."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import peewee as pw

from webhooks.storage.records.db import db, is_mysql
from webhooks.storage.records.models import ALL_MODELS, SchemaMigration

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parents[3] / "sql"  # the checkout's sql/
_MIGRATIONS_DDL = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " version VARCHAR(32) NOT NULL PRIMARY KEY, applied_at DATETIME(6) NOT NULL"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
)


def migration_files() -> list[Path]:
    return sorted(p for p in SQL_DIR.glob("[0-9][0-9][0-9]_*.sql"))


def split_statements(sql: str) -> list[str]:
    """Statements of a DDL file: comments dropped, split on ';' at end of line."""
    text = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in re.split(r";\s*$", text, flags=re.M) if s.strip()]


# Migrations whose INSERT statements are portable SQL that carries rows over: on SQLite, where the
# models make the tables, upgrade() runs those statements still (sql/022: every sold lead's sale;
# sql/025: the report's sales counted as its sold leads; sql/026: its offers as its sales),
# UPDATEs too; sql/034: the report's days of the hours before it.
SQLITE_DATA = {"022", "025", "026", "034"}


_RENAME = re.compile(r"^RENAME\s+TABLES?\s+(?:IF\s+EXISTS\s+)?(.+)$", re.I | re.S)


def table_renames(statement: str) -> list[tuple[str, str]]:
    """The (old, new) table names of a RENAME TABLE statement; [] for any other statement."""
    found = _RENAME.match(statement.strip())
    if not found:
        return []
    pairs = [re.split(r"\s+TO\s+", pair.strip(), flags=re.I) for pair in found.group(1).split(",")]
    return [(old.strip("` "), new.strip("` ")) for old, new in pairs]


def upgrade(echo: Callable[[str], None] = log.info) -> list[str]:
    """Bring the schema up to date; return the versions applied now (empty when current)."""
    with db.connection_context():
        if is_mysql():
            db.execute_sql(_MIGRATIONS_DDL)
        else:
            _sqlite_schema()
        done = {m.version for m in SchemaMigration.select()}
        applied = []
        for path in migration_files():
            version = path.name.split("_", 1)[0]
            if version in done:
                continue
            echo(f"applying {path.name}")
            if is_mysql():
                for statement in split_statements(path.read_text()):
                    db.execute_sql(statement)
            elif version in SQLITE_DATA:
                for statement in split_statements(path.read_text()):
                    if statement.upper().startswith(("INSERT", "UPDATE")):
                        db.execute_sql(statement)
            SchemaMigration.insert(version=version).on_conflict_ignore().execute()
            applied.append(version)
        if not applied:
            echo("schema is up to date")
        return applied


def _sqlite_schema() -> None:
    """SQLite is the embedded default: the models (checked against the DDL on MySQL) create the
    same tables and unique keys, and the columns a later migration added; a table a migration
    renamed is renamed first, so that its rows stay. The indexes come last: SQLite takes an
    index on a column the file does not have yet for an index on the text "column" (a
    double-quoted string), and keeps its entries wrong once the column is added."""
    _rename_tables()
    for model in ALL_MODELS:  # no foreign keys between them: any order
        pw.SchemaManager(model, db).create_table(safe=True)
    _add_missing_columns()
    for model in ALL_MODELS:
        pw.SchemaManager(model, db).create_indexes(safe=True)


def _add_missing_columns() -> None:
    """SQLite: give an existing ledger file the columns its models gained since it was made."""
    from playhouse.migrate import SqliteMigrator, migrate

    migrator = SqliteMigrator(db)
    for model in ALL_MODELS:
        have = {c.name for c in db.get_columns(model._meta.table_name)}
        missing = [f for f in model._meta.sorted_fields if f.column_name not in have]
        if missing:
            migrate(*(migrator.add_column(model._meta.table_name, f.column_name, f) for f in missing))


def _rename_tables() -> None:
    """SQLite: the migrations' RENAME TABLE statements, on a ledger file that still has the old
    table. SQLite keeps the table's indexes under their old names (peewee names them after the
    table): they are dropped, and create_tables makes them again under the new name."""
    tables = set(db.get_tables())
    for path in migration_files():
        for statement in split_statements(path.read_text()):
            for old, new in table_renames(statement):
                if old not in tables or new in tables:
                    continue
                with db.atomic():
                    db.execute_sql(f'ALTER TABLE "{old}" RENAME TO "{new}"')
                    for index in db.get_indexes(new):
                        if index.sql:  # not an index SQLite made for a constraint of the table
                            db.execute_sql(f'DROP INDEX "{index.name}"')
                tables = (tables - {old}) | {new}
