"""The peewee database: a proxy bound by `init_db()` from DATABASE_URL (MySQL pool or SQLite)."""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import unquote, urlparse

import peewee
from playhouse.pool import MaxConnectionsExceeded, PooledMySQLDatabase

from webhooks.errors import ConfigError

log = logging.getLogger(__name__)

db = peewee.DatabaseProxy()

# Errors that mean "the database is not answering", as opposed to a bug or a constraint. A
# pool with no free connection after its wait is one: the database is not keeping up.
UNAVAILABLE_ERRORS = (peewee.OperationalError, peewee.InterfaceError, MaxConnectionsExceeded)


class Pool(PooledMySQLDatabase):
    """playhouse's MySQL pool without two round trips per request: it pings every connection it
    hands out and rolls back every one it takes back. Here a connection back within
    PING_AFTER_S is handed out without a ping (the server closes idle connections after hours,
    not seconds; one it closed anyway fails its next statement, which the caller answers as the
    database being unavailable, and the pool discards it), and one comes back with a rollback
    only when the server says a transaction is open (its status flags, sent with every reply)."""

    PING_AFTER_S = 30.0
    IN_TRANSACTION = 1  # SERVER_STATUS_IN_TRANS of the MySQL protocol (pymysql.constants.SERVER_STATUS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._returned_at: dict[int, float] = {}

    def _is_closed(self, conn: Any) -> bool:
        if not conn.open:
            return True
        returned = self._returned_at.get(id(conn))
        if returned is not None and time.monotonic() - returned < self.PING_AFTER_S:
            return False
        return bool(super()._is_closed(conn))  # type: ignore[no-untyped-call]

    def _can_reuse(self, conn: Any) -> bool:
        if not conn.open:
            return False
        if conn.server_status & self.IN_TRANSACTION:
            try:
                conn.rollback()
            except Exception:  # any failure: not reusable
                return False
        self._returned_at[id(conn)] = time.monotonic()
        return True

    def _close_raw(self, conn: Any) -> None:
        self._returned_at.pop(id(conn), None)
        super()._close_raw(conn)  # type: ignore[no-untyped-call]


def make_database(url: str, pool_size: int = 10) -> peewee.Database:
    """A peewee Database for `url`: a bounded, blocking MySQL pool, or SQLite in WAL mode."""
    parts = urlparse(url)
    if parts.scheme == "mysql":
        name = parts.path.lstrip("/")
        if not name:
            raise ConfigError("DATABASE_URL names no database")
        return Pool(
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
