"""The peewee database: a proxy bound by `init_db()` from DATABASE_URL (MySQL pool or SQLite)."""

from __future__ import annotations

import functools
import ipaddress
import logging
import random
import select
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeAlias, TypeVar
from urllib.parse import parse_qs, unquote, urlparse

import peewee
from playhouse.pool import MaxConnectionsExceeded, PooledMySQLDatabase
from pymysql import converters  # type: ignore[import-untyped]
from pymysql.connections import Connection  # type: ignore[import-untyped]
from pymysql.constants import CLIENT, SERVER_STATUS  # type: ignore[import-untyped]

from webhooks.errors import ConfigError

log = logging.getLogger(__name__)

db = peewee.DatabaseProxy()

# Errors that mean "the database is not answering", as opposed to a bug or a constraint. A
# pool with no free connection after its wait is one: the database is not keeping up.
UNAVAILABLE_ERRORS = (peewee.OperationalError, peewee.InterfaceError, MaxConnectionsExceeded)


Statement: TypeAlias = "tuple[str, Sequence[Any]]"  # SQL with %s marks, and its values
T = TypeVar("T")
_BEGIN: Statement = ("BEGIN", ())
_DRIVER_ERRORS = getattr(peewee, "__exception_wrapper__")  # noqa: B009  (a dunder name of peewee's)

# MySQL's client errors for a connection that is gone: "server has gone away" (the request could
# not be sent), "lost connection during query" (no answer came), "lost connection" (at the
# handshake). PyMySQL raises InterfaceError for a connection it had closed already.
LOST_CONNECTION = frozenset({2006, 2013, 2055})
# Refused as a whole at commit, nothing of it kept: an InnoDB deadlock, or on Galera a
# certification conflict (a write on another node touched the same rows first).
DEADLOCK = 1213
TRANSACTION_ATTEMPTS = 4  # a transaction refused as a whole is run this many times at most
COMMIT_SENT = "the connection was lost with the COMMIT sent: whether it was kept is unknown"


def error_code(exc: BaseException) -> int | None:
    """MySQL's error number of a driver error as peewee re-raises it ((original, errno, text))."""
    for arg in exc.args:
        if isinstance(arg, int):
            return arg
        if isinstance(arg, Exception) and arg.args and isinstance(arg.args[0], int):
            return arg.args[0]
    return None


def lost_connection(exc: BaseException) -> bool:
    """Whether `exc` says the connection itself is gone (not the statement refused)."""
    return isinstance(exc, peewee.InterfaceError) or error_code(exc) in LOST_CONNECTION


def hung_up(conn: Any) -> bool:
    """Whether an idle connection was closed from the other end, found with no round trip: a
    socket that has something to read while no statement waits for an answer holds the end of
    the stream (a proxy or server that closed it: a dead writing node's connections, closed by
    HAProxy) or a last error packet sent as the server closed it. One poll(2) of the socket,
    a few microseconds."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return True
    poller = _poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def server_of(conn: Any) -> str:
    """The server a new connection reached, as that server names itself: behind a proxy, the
    node (one query, made only when connections were replaced, for the log)."""
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT @@hostname, @@port")
            host, port = cursor.fetchone()
        return f"{host}:{port}"
    except Exception:  # a log line's detail: never the cause of a request's failure
        return "a server that did not say which"


def _original_poll() -> Callable[[], Any]:
    """The operating system's poll, not gevent's cooperative one: a zero-timeout poll never
    waits, so yielding to the event loop for it would only cost a switch."""
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover  (gevent is a dependency of the web process)
        return select.poll
    return monkey.get_original("select", "poll")  # type: ignore[no-any-return]


_poll = _original_poll()


class Line:
    """Callers waiting for a pooled connection, first come, first served. A caller goes at
    once when nobody waits and the pool has a connection free; otherwise it waits in line, and
    each connection given back wakes the first in line with that connection set aside for it.
    Connections freed together so wake as many callers at once. (A line that passed one turn
    from caller to caller advanced one caller per pass of the event loop, however many
    connections were free: under load the wait for a turn reached ~120 ms with 2 of 10
    connections in use.) `threading`'s Lock and Event are gevent's in a web worker."""

    RECHECK_S = 1.0  # the first in line looks for a connection freed without a wake this often

    def __init__(self, free: Callable[[], int]) -> None:
        self._free = free  # connections the pool can give out now (idle or not yet made)
        self._lock = threading.Lock()
        self._waiting: deque[threading.Event] = deque()
        self._set_aside = 0  # callers woken with a connection kept for them, not yet taken

    def enter(self, timeout: float) -> bool:
        """Wait until a connection is ours to take, up to `timeout` seconds; whether it is.
        A caller let in must call `taken()` once it has tried to connect."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if not self._waiting and self._free() - self._set_aside > 0:
                self._set_aside += 1
                return True
            mine = threading.Event()
            self._waiting.append(mine)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining > 0 and mine.wait(min(remaining, self.RECHECK_S)):
                    return True
                with self._lock:
                    if mine.is_set():  # woken as the wait ended
                        return True
                    first = self._waiting[0] is mine
                    if first and self._free() - self._set_aside > 0:  # freed with no wake
                        self._waiting.popleft()
                        self._set_aside += 1
                        return True
                    if remaining <= 0:
                        self._waiting.remove(mine)
                        return False
        except BaseException:  # killed while waiting (a request's deadline, a worker's exit)
            with self._lock:
                woken = mine not in self._waiting
                if not woken:
                    self._waiting.remove(mine)
            if woken:  # the connection kept for us meanwhile goes to the next in line
                self.taken()
                self.freed()
            raise

    def taken(self) -> None:
        """A caller let in has connected (or failed to): its connection is no longer kept."""
        with self._lock:
            self._set_aside -= 1

    def freed(self) -> None:
        """A connection went back to the pool (or was closed): wake the first in line."""
        with self._lock:
            if self._waiting and self._free() - self._set_aside > 0:
                self._waiting.popleft().set()
                self._set_aside += 1

    @property
    def queued(self) -> int:
        """Callers waiting in line for a connection."""
        with self._lock:
            return len(self._waiting)


def escape_string(s: str) -> str:
    """PyMySQL's `converters.escape_string`, the same output: the seven characters it escapes,
    each replaced in one pass of `str.replace` (C), where PyMySQL's `str.translate` through a
    table costs a lookup per character, about 30 ns (66 µs for a 1.9 KB JSON text, against
    12 µs here). The backslash goes first, so no escape is escaped again."""
    return (
        s.replace("\\", "\\\\")
        .replace("\0", "\\0")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\032", "\\Z")
        .replace('"', '\\"')
        .replace("'", "\\'")
    )


def _escape_datetime(obj: datetime, mapping: Any = None) -> str:
    """PyMySQL's `escape_datetime`, the same literal for a naive datetime, by `isoformat` (0.8
    against 3.0 µs); an aware one is left to PyMySQL, which drops its zone."""
    if obj.tzinfo is None:
        return f"'{obj.isoformat(' ')}'"
    return str(converters.escape_datetime(obj, mapping))


class _Connection(Connection):  # type: ignore[misc]
    """PyMySQL's connection with the faster `escape_string` and `_escape_datetime` above (a
    credit's rows carry about 1.2 KB of text, the event's payload and the call's headers, and
    four datetimes); every other value is escaped by PyMySQL as before."""

    encoders: dict[type, Callable[..., str]]  # PyMySQL's: type -> its escape

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.encoders = {**self.encoders, datetime: _escape_datetime}

    def _escape_string(self, s: str) -> str:
        if self.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
            return s.replace("'", "''")
        return escape_string(s)


class _MySQL(peewee.MySQLDatabase):
    """peewee's MySQL database on `_Connection`s (the pool's connections are made here)."""

    def _connect(self) -> Any:
        return _Connection(database=self.database, autocommit=True, **self.connect_params)


class Pool(PooledMySQLDatabase, _MySQL):  # type: ignore[misc]  # the stubs differ on init()
    """playhouse's MySQL pool without two round trips per request: it pings every connection it
    hands out and rolls back every one it takes back. Here a connection back within
    PING_AFTER_S is handed out without a ping (the server closes idle connections after hours,
    not seconds; one it closed anyway fails its next statement, which the caller answers as the
    database being unavailable, and the pool discards it), and one comes back with a rollback
    only when the server says a transaction is open (its status flags, sent with every reply).

    A transaction's statements that need no answer travel with the next one that does: BEGIN
    goes with the transaction's first statement (InnoDB takes its snapshot at the first read,
    not at BEGIN, so nothing changes), and what `defer` holds goes with the next statement or
    with the COMMIT. A credit is then two round trips, not six (bench/REPORT.md part 11). The
    connections accept several statements per query for this (CLIENT.MULTI_STATEMENTS); every
    value still travels escaped by the driver, never spliced into SQL. A deferred statement's
    error is raised by the statement it travels with, or by the commit, which then rolls the
    whole transaction back: defer only what the transaction fails with as a whole."""

    PING_AFTER_S = 30.0
    IN_TRANSACTION = 1  # SERVER_STATUS_IN_TRANS of the MySQL protocol (pymysql.constants.SERVER_STATUS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._returned_at: dict[int, float] = {}
        self._lost_since: float | None = None  # when a pooled connection was first found closed
        self._line = Line(lambda: self._max_connections - len(self._in_use))

    def connect(self, reuse_if_open: bool = False) -> bool:
        """A connection for this thread (greenlet), given out first come, first served. The
        playhouse pool wakes one waiter per connection returned, but a caller arriving meanwhile
        may take it first, again and again: at 50 requests at once on 10 connections, the
        payment path's p99 was 0.8-2 s where the median was 50 ms (bench/levers.py db_pool).
        Here callers wait in a Line, up to the pool's own wait."""
        if not self.is_closed():
            return bool(super().connect(reuse_if_open))  # type: ignore[no-untyped-call]
        if not self._line.enter(self._wait_timeout):
            raise MaxConnectionsExceeded("no database connection free within the pool's wait")
        try:
            return bool(super().connect(reuse_if_open))  # type: ignore[no-untyped-call]
        finally:
            self._line.taken()
            if self.is_closed():  # no connection made (the server unreachable): the next may try
                self._line.freed()

    def _close(self, conn: Any, close_conn: bool = False) -> None:
        super()._close(conn, close_conn)
        self._line.freed()

    def _is_closed(self, conn: Any) -> bool:
        """Whether a pooled connection is unfit to hand out; one that is gets closed here (the
        pool only drops it). Its socket is looked at without a round trip first: the connections
        a dead writing node held are closed by the proxy, and each is found so before it is
        used, not by the request it fails (issue: the ledger on a cluster)."""
        dead = self._dead(conn)
        if dead:
            self._close_raw(conn)  # idle, so not counted in use: no turn in the Line changes
        return dead

    def _dead(self, conn: Any) -> bool:
        if not conn.open:
            return True
        if hung_up(conn):
            if self._lost_since is None:  # said once for all the connections a node's death closed
                self._lost_since = time.monotonic()
                log.warning("pooled database connections closed by the server or its proxy: replacing them")
            return True
        returned = self._returned_at.get(id(conn))
        if returned is not None and time.monotonic() - returned < self.PING_AFTER_S:
            return False
        return bool(super()._is_closed(conn))  # type: ignore[no-untyped-call]

    def _connect(self) -> Any:
        conn = super()._connect()
        # Handed out again after a spell in the pool: its first statement may still meet a
        # connection that died unseen, and is then sent again on a new one (execute_sql).
        conn.floodgate_unproven = id(conn) in self._returned_at
        if not conn.floodgate_unproven and self._lost_since is not None:
            lost, self._lost_since = self._lost_since, None
            log.warning(
                "database connections replaced %.1f s after the first was found closed; new ones reach %s",
                time.monotonic() - lost,
                server_of(conn),
            )
        return conn

    def _can_reuse(self, conn: Any) -> bool:
        conn.floodgate_pending = []  # statements of a transaction given up before they were sent
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

    # --- statements that travel with the next one -------------------------------------------

    def _take_pending(self) -> list[Statement]:
        conn = self._state.conn  # type: ignore[attr-defined]
        pending: list[Statement] = getattr(conn, "floodgate_pending", None) or []
        if pending:
            conn.floodgate_pending = []
        return pending

    def _add_pending(self, statement: Statement) -> None:
        conn = self._state.conn  # type: ignore[attr-defined]
        conn.floodgate_pending = [*(getattr(conn, "floodgate_pending", None) or []), statement]

    def begin(self, isolation_level: str | None = None) -> None:
        if isolation_level is not None:
            super().begin(isolation_level)
            return
        if self.is_closed():
            self.connect()
        self._reopen_if_lost()  # a transaction retried after its connection died starts anew
        self._take_pending()  # nothing of a previous transaction outlives it
        self._add_pending(_BEGIN)

    def defer(self, sql: str, params: Sequence[Any]) -> None:
        """Run `sql` with the transaction's next statement or its commit (outside a
        transaction: now)."""
        if self.in_transaction():
            self._add_pending((sql, tuple(params)))
        else:
            self.execute_sql(sql, params)

    def execute_sql(self, sql: str, params: Any = None) -> Any:
        if self.is_closed():
            return super().execute_sql(sql, params)  # type: ignore[no-untyped-call]
        if not self.in_transaction():
            self._reopen_if_lost()
        conn = self._state.conn  # type: ignore[attr-defined]
        pending = self._take_pending()
        try:
            return self._execute(pending, sql, params)
        except UNAVAILABLE_ERRORS as exc:
            # The first statement on a connection back from the pool found it dead: if none of
            # what it carried can have taken effect, it goes again on a new connection.
            if not (getattr(conn, "floodgate_unproven", False) and lost_connection(exc)):
                raise
            if not (pending[:1] == [_BEGIN] or (not pending and not self.in_transaction() and _reads(sql))):
                raise
            log.warning("a pooled database connection was found dead by its first statement (%s): sent again", exc)
            self._reopen(conn)
            return self._execute(pending, sql, params)
        finally:
            conn.floodgate_unproven = False

    def _execute(self, pending: list[Statement], sql: str, params: Any) -> Any:
        if not pending:
            return super().execute_sql(sql, params)  # type: ignore[no-untyped-call]
        if params is None and "%" in sql:  # a statement whose % is no mark: not merged with marks
            self._send(pending)
            return super().execute_sql(sql, params)  # type: ignore[no-untyped-call]
        return self._send([*pending, (sql, tuple(params or ()))])

    def _reopen_if_lost(self) -> None:
        """This greenlet's connection connected anew if the driver found it dead before (outside a
        transaction, or as one begins: the server rolled back whatever it had open)."""
        conn = self._state.conn  # type: ignore[attr-defined]
        if conn is not None and not conn.open:
            self._reopen(conn)

    @staticmethod
    def _reopen(conn: Any) -> None:
        """Connect `conn` again in place: the pool's count of connections in use is unchanged."""
        conn.floodgate_pending = []
        with _DRIVER_ERRORS:
            conn.connect()
        log.warning("a database connection found dead was made again; it reaches %s", server_of(conn))

    def _send(self, statements: list[Statement]) -> Any:
        """Run `statements` in one round trip; the cursor of the last. The first that fails
        raises (the server runs none after it)."""
        sql, params = "; ".join(s for s, _ in statements), [v for _, p in statements for v in p]
        cursor = super().execute_sql(sql, params)  # type: ignore[no-untyped-call]
        with _DRIVER_ERRORS:  # raised as peewee's own errors, as execute_sql raises them
            for _ in statements[1:]:
                cursor.nextset()
        return cursor

    def commit(self) -> None:
        pending = self._take_pending() if not self.is_closed() else []
        if pending == [_BEGIN]:
            return  # the transaction ran no statement: nothing was sent, nothing to end
        try:
            if pending:
                self._send([*pending, ("COMMIT", ())])
                return
            super().commit()
        except UNAVAILABLE_ERRORS as exc:
            exc.add_note(COMMIT_SENT)  # its outcome is unknown: see `retried`
            raise

    def rollback(self) -> None:
        pending = self._take_pending() if not self.is_closed() else []
        if pending[:1] == [_BEGIN]:
            return  # its BEGIN was never sent: nothing of it reached the server
        if not self.is_closed() and not self._state.conn.open:  # type: ignore[attr-defined]
            return  # the connection died: the server rolled back what it had open
        super().rollback()


def _reads(sql: str) -> bool:
    """Whether `sql` only reads (sent again, it changes nothing)."""
    return sql.lstrip()[:6].upper() in ("SELECT", "SHOW")


class SQLite(peewee.SqliteDatabase):
    """The embedded ledger (WAL mode), written by the web and worker processes at once. SQLite
    has one writer at a time. A transaction opened with a plain BEGIN asks for the write lock
    at its first write, and SQLite refuses it at once ("database is locked"), without waiting,
    when another connection holds that lock or wrote since the transaction's first read. So
    every transaction here begins IMMEDIATE: it takes the write lock first, waiting up to
    BUSY_TIMEOUT_MS for another process's transaction to end.

    Within a process the writers take turns on a lock of their own before they ask SQLite:
    SQLite's wait for the write lock sleeps the whole process, so in a gevent web worker a
    greenlet waiting so would keep the greenlet that holds the lock from ever committing. A
    write outside a transaction takes its turn too; reads never wait (WAL)."""

    BUSY_TIMEOUT_MS = 10_000

    def __init__(self, path: str) -> None:
        pragmas = {"journal_mode": "wal", "busy_timeout": self.BUSY_TIMEOUT_MS, "foreign_keys": 1}
        super().__init__(path, pragmas=pragmas, lock_type="IMMEDIATE")
        self._writer = threading.Lock()  # made at init_db: gevent's in a web worker
        self._holder = threading.local()  # .writing: this thread (greenlet) holds _writer

    def _take_writer(self) -> None:
        if getattr(self._holder, "writing", False):
            return
        if not self._writer.acquire(timeout=self.BUSY_TIMEOUT_MS / 1000):
            raise peewee.OperationalError("database is locked: another writer of this process held it throughout")
        self._holder.writing = True

    def _give_writer(self) -> None:
        if getattr(self._holder, "writing", False):
            self._holder.writing = False
            self._writer.release()

    def begin(self, lock_type: str | None = None) -> None:
        self._take_writer()
        try:
            super().begin(lock_type)
        except BaseException:
            self._give_writer()
            raise

    def commit(self) -> None:
        super().commit()
        self._give_writer()  # not on failure: the rollback that follows gives it

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self._give_writer()

    def execute_sql(self, sql: str, params: Any = None) -> Any:
        if getattr(self._holder, "writing", False) or _reads(sql):
            return super().execute_sql(sql, params)  # type: ignore[no-untyped-call]
        self._take_writer()  # a write outside a transaction
        try:
            return super().execute_sql(sql, params)  # type: ignore[no-untyped-call]
        finally:
            self._give_writer()

    def _close(self, conn: Any) -> None:
        try:
            super()._close(conn)  # type: ignore[misc]
        finally:
            self._give_writer()  # a transaction never ended holds it no longer


SSL_MODES = ("disabled", "preferred", "required", "verify_ca", "verify_identity")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@functools.cache
def _ssl_context(mode: str, ca: str | None) -> ssl.SSLContext:
    """One TLS context per process and setting: PyMySQL builds one per connection otherwise
    (tens of ms of CPU each, loading the system's certificates)."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = mode == "verify_identity"
    ctx.verify_mode = ssl.CERT_REQUIRED if mode in ("verify_ca", "verify_identity") else ssl.CERT_NONE
    return ctx


def tls_options(host: str, query: str) -> dict[str, Any]:
    """PyMySQL's TLS arguments for DATABASE_URL's `?ssl_mode=` (or `ssl-mode`; MySQL's names:
    disabled, preferred, required, verify_ca, verify_identity; `ssl_ca=<file>` for the last two).
    Unset: disabled for a loopback host (nothing on the wire to protect), else preferred (TLS
    when the server offers it, PyMySQL's own default)."""
    params = {k.replace("-", "_"): v[-1] for k, v in parse_qs(query).items()}
    mode = params.get("ssl_mode", "").lower().replace("-", "_") or ("disabled" if _loopback(host) else "preferred")
    if mode not in SSL_MODES:
        raise ConfigError(f"DATABASE_URL ssl_mode must be one of {', '.join(SSL_MODES)}")
    ca = params.get("ssl_ca")
    if mode in ("verify_ca", "verify_identity") and not ca:
        raise ConfigError(f"DATABASE_URL ssl_mode={mode} needs ssl_ca=<file of the CA certificates>")
    if mode == "disabled":
        return {"ssl_disabled": True}
    if mode == "preferred":
        return {}  # PyMySQL's own: TLS if the server offers it (a context per connection)
    return {"ssl": _ssl_context(mode, ca)}


def make_database(url: str, pool_size: int = 10) -> peewee.Database:
    """A peewee Database for `url`: a bounded, blocking MySQL pool, or SQLite (`SQLite`)."""
    parts = urlparse(url)
    if parts.scheme == "mysql":
        name = parts.path.lstrip("/")
        if not name:
            raise ConfigError("DATABASE_URL names no database")
        host = parts.hostname or "127.0.0.1"
        return Pool(
            name,
            **tls_options(host, parts.query),
            host=host,
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            charset="utf8mb4",
            client_flag=CLIENT.MULTI_STATEMENTS,  # see Pool: a transaction's statements batched
            max_connections=pool_size,
            stale_timeout=300,
            timeout=10,  # wait up to 10 s for a free connection instead of failing at once
            connect_timeout=3,
            read_timeout=30,
            write_timeout=30,
        )
    if parts.scheme == "sqlite":
        return SQLite(url[len("sqlite:///") :])
    raise ConfigError(f"unsupported DATABASE_URL scheme {parts.scheme!r}")


def init_db(url: str, pool_size: int = 10) -> peewee.Database:
    """Bind the module proxy to a database for `url` and return it (no connection is opened)."""
    database = make_database(url, pool_size)
    db.initialize(database)
    return database


def is_mysql() -> bool:
    return isinstance(db.obj, peewee.MySQLDatabase)


@contextmanager
def borrowed() -> Iterator[None]:
    """A connection for what runs inside, given back to the pool as soon as it is done, when
    this greenlet held none (a payment's credit: the request's teardown comes after a Redis
    round trip and the answer, and other requests wait their turn for it meanwhile). A
    connection the caller holds already, a transaction perhaps, is left as it is."""
    if db.obj is None or not db.is_closed():
        yield
        return
    with db.connection_context():
        yield


def close_db(_exc: BaseException | None = None) -> None:
    """Give this greenlet's connection back to the pool (Flask teardown, end of a job)."""
    if db.obj is not None and not db.is_closed():
        db.close()


def retried(transaction: Callable[[], T], what: str) -> T:
    """Run `transaction` (which opens its own), and run it again, whole, when the database
    refused all of it: an InnoDB deadlock or a Galera certification conflict (1213), or its
    connection lost before its COMMIT was sent (nothing of it was kept, and the next attempt
    connects anew). A connection lost with the COMMIT on its way is not retried: whether it
    was kept is unknown, and the caller answers 5xx so that its sender retries, which every
    ledger write takes as a duplicate (docs/cluster.md lists each write's unique key)."""
    attempt = 1
    while True:
        try:
            return transaction()
        except UNAVAILABLE_ERRORS as exc:
            again = error_code(exc) == DEADLOCK or (
                lost_connection(exc) and COMMIT_SENT not in getattr(exc, "__notes__", ())
            )
            if attempt >= TRANSACTION_ATTEMPTS or not again:
                raise
            log.warning("%s refused as a whole (%s): attempt %d", what, exc, attempt + 1)
            time.sleep(random.uniform(0.005, 0.02) * attempt)
            attempt += 1
