"""The peewee database: a proxy bound by `init_db()` from DATABASE_URL (MySQL pool or SQLite)."""

from __future__ import annotations

import logging
from urllib.parse import unquote, urlparse

import peewee
from playhouse.pool import MaxConnectionsExceeded, PooledMySQLDatabase

from webhooks.errors import ConfigError

log = logging.getLogger(__name__)

db = peewee.DatabaseProxy()

# Errors that mean "the database is not answering", as opposed to a bug or a constraint. A
# pool with no free connection after its wait is one: the database is not keeping up.
UNAVAILABLE_ERRORS = (peewee.OperationalError, peewee.InterfaceError, MaxConnectionsExceeded)


def make_database(url: str, pool_size: int = 10) -> peewee.Database:
    """A peewee Database for `url`: a bounded, blocking MySQL pool, or SQLite in WAL mode."""
    parts = urlparse(url)
    if parts.scheme == "mysql":
        name = parts.path.lstrip("/")
        if not name:
            raise ConfigError("DATABASE_URL names no database")
        return PooledMySQLDatabase(
            name,
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            charset="utf8mb4",
            max_connections=pool_size,
            stale_timeout=300,
            timeout=10,  # wait up to 10 s for a free connection instead of failing at once
            connect_timeout=3,
            read_timeout=30,
            write_timeout=30,
        )
    if parts.scheme == "sqlite":
        path = url[len("sqlite:///") :]
        return peewee.SqliteDatabase(path, pragmas={"journal_mode": "wal", "busy_timeout": 10_000, "foreign_keys": 1})
    raise ConfigError(f"unsupported DATABASE_URL scheme {parts.scheme!r}")


def init_db(url: str, pool_size: int = 10) -> peewee.Database:
    """Bind the module proxy to a database for `url` and return it (no connection is opened)."""
    database = make_database(url, pool_size)
    db.initialize(database)
    return database


def is_mysql() -> bool:
    return isinstance(db.obj, peewee.MySQLDatabase)


def close_db(_exc: BaseException | None = None) -> None:
    """Give this greenlet's connection back to the pool (Flask teardown, end of a job)."""
    if db.obj is not None and not db.is_closed():
        db.close()
