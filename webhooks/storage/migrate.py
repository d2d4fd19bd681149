"""Apply sql/NNN_*.sql in order, once each, recording versions in schema_migrations."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

from webhooks.storage.db import db, is_mysql
from webhooks.storage.models import ALL_MODELS, SchemaMigration

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"  # the checkout's sql/
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


def upgrade(echo: Callable[[str], None] = log.info) -> list[str]:
    """Bring the schema up to date; return the versions applied now (empty when current)."""
    with db.connection_context():
        if is_mysql():
            db.execute_sql(_MIGRATIONS_DDL)
        else:
            # SQLite is the embedded default: the models (checked against the DDL on MySQL)
            # create the same tables and unique keys, and the columns a later migration added.
            db.create_tables(ALL_MODELS, safe=True)
            _add_missing_columns()
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
            SchemaMigration.insert(version=version).on_conflict_ignore().execute()
            applied.append(version)
        if not applied:
            echo("schema is up to date")
        return applied


def _add_missing_columns() -> None:
    """SQLite: give an existing ledger file the columns its models gained since it was made."""
    from playhouse.migrate import SqliteMigrator, migrate

    migrator = SqliteMigrator(db)
    for model in ALL_MODELS:
        have = {c.name for c in db.get_columns(model._meta.table_name)}
        missing = [f for f in model._meta.sorted_fields if f.column_name not in have]
        if missing:
            migrate(*(migrator.add_column(model._meta.table_name, f.column_name, f) for f in missing))
