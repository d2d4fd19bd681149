"""The MySQL connection pool (storage/records/db.py Pool) on the real MariaDB: no ping and no rollback
per request, yet a transaction left open is rolled back on check-in and a connection the server
closed is not handed out again."""

from __future__ import annotations

import re
import threading
from datetime import datetime, timezone

import peewee
import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.servers import CutProxy, TcpProxy, wait_until
from webhooks.storage.records.db import Pool, escape_string, hung_up, is_mysql, make_database, retried


@pytest.fixture
def pool(database_url):
    if not is_mysql():
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306)")
    made = make_database(database_url, pool_size=2)
    assert isinstance(made, Pool)
    yield made
    made.close_all()


@pytest.fixture
def calls(monkeypatch):
    """Count the driver's pings and rollbacks (the real calls still run)."""
    counted = {"ping": 0, "rollback": 0}
    for name in counted:
        real = getattr(pymysql.connections.Connection, name)

        def counting(self, *args, _real=real, _name=name, **kwargs):
            counted[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(pymysql.connections.Connection, name, counting)
    return counted


def test_a_hundred_transactions_cost_no_ping_and_no_rollback(pool, calls):
    for _ in range(100):
        with pool.connection_context(), pool.atomic():
            assert pool.execute_sql("SELECT 1").fetchone() == (1,)
    assert calls == {"ping": 0, "rollback": 0}


def test_a_transaction_left_open_is_rolled_back_when_its_connection_comes_back(pool, calls):
    pool.connect()
    pool.execute_sql("CREATE TEMPORARY TABLE t (x INT) ENGINE=InnoDB")
    pool.execute_sql("BEGIN")
    pool.execute_sql("INSERT INTO t VALUES (1)")
    conn = pool.connection()
    pool.close()  # back to the pool with the transaction open
    assert calls["rollback"] == 1
    pool.connect()
    assert pool.connection() is conn  # reused, and clean
    assert pool.execute_sql("SELECT COUNT(*) FROM t").fetchone() == (0,)
    pool.close()


def test_a_connection_the_server_closed_is_replaced_before_use_without_a_ping(pool, database_url, calls):
    pool.connect()
    first = pool.connection()
    thread_id = first.thread_id()
    pool.close()
    killer = make_database(database_url, pool_size=1)
    with killer.connection_context():
        killer.execute_sql(f"KILL CONNECTION {int(thread_id)}")
    killer.close_all()
    wait_until(lambda: hung_up(first), timeout=10, what="the killed connection's socket to say so")
    with pool.connection_context():
        assert pool.connection() is not first
        assert pool.execute_sql("SELECT 1").fetchone() == (1,)
    assert calls["ping"] == 0  # found by its socket, not by a round trip
    assert not first.open  # closed, not only dropped from the pool


@pytest.fixture
def queries(monkeypatch):
    """(connection, SQL) of every query the driver sends: one per round trip (the real calls run)."""
    sent: list[tuple[object, str]] = []
    real = pymysql.connections.Connection.query

    def counting(self, sql, unbuffered=False):
        sent.append((self, sql if isinstance(sql, str) else sql.decode()))
        return real(self, sql, unbuffered)

    monkeypatch.setattr(pymysql.connections.Connection, "query", counting)
    return sent


@pytest.fixture
def table(pool):
    with pool.connection_context():
        pool.execute_sql("CREATE TABLE IF NOT EXISTS pool_t (k VARCHAR(20) PRIMARY KEY, v INT) ENGINE=InnoDB")
        pool.execute_sql("DELETE FROM pool_t")
    yield "pool_t"
    with pool.connection_context():
        pool.execute_sql("DROP TABLE pool_t")


def rows(database_url) -> list[tuple]:
    """pool_t as another connection sees it (committed rows only)."""
    other = make_database(database_url, pool_size=1)
    with other.connection_context():
        found = list(other.execute_sql("SELECT k, v FROM pool_t ORDER BY k").fetchall())
    other.close_all()
    return found


def test_a_transaction_s_begin_and_deferred_statements_share_round_trips(pool, table, queries, database_url):
    with pool.connection_context():
        queries.clear()
        with pool.atomic():
            pool.defer("INSERT INTO pool_t VALUES (%s, %s)", ("a", 1))
            cursor = pool.execute_sql("INSERT INTO pool_t VALUES (%s, %s)", ("b", 2))
            assert cursor.rowcount == 1  # the reply read is the last statement's
            assert rows(database_url) == []  # BEGIN went first: nothing is visible before the commit
            pool.defer("INSERT INTO pool_t VALUES (%s, %s)", ("c", 3))
        mine = [sql for conn, sql in queries if conn is pool.connection()]
        assert len(mine) == 2
        assert mine[0].startswith("BEGIN; INSERT") and mine[1].endswith("; COMMIT")
    assert rows(database_url) == [("a", 1), ("b", 2), ("c", 3)]


def test_a_deferred_statement_s_error_fails_the_commit_and_keeps_nothing(pool, table, database_url):
    with pool.connection_context():
        with pytest.raises(peewee.IntegrityError), pool.atomic():
            pool.execute_sql("INSERT INTO pool_t VALUES (%s, %s)", ("a", 1))
            pool.defer("INSERT INTO pool_t VALUES (%s, %s)", ("a", 2))  # a duplicate key
        assert pool.execute_sql("SELECT COUNT(*) FROM pool_t").fetchone() == (0,)  # and the connection works
    assert rows(database_url) == []


def test_an_error_inside_a_batch_stops_it_and_the_rest_is_not_run(pool, table, database_url):
    with pool.connection_context():
        pool.execute_sql("INSERT INTO pool_t VALUES (%s, %s)", ("a", 1))
        with pytest.raises(peewee.IntegrityError), pool.atomic():
            pool.defer("INSERT INTO pool_t VALUES (%s, %s)", ("a", 2))  # fails: the server stops here
            pool.defer("INSERT INTO pool_t VALUES (%s, %s)", ("z", 26))
            pool.execute_sql("INSERT INTO pool_t VALUES (%s, %s)", ("y", 25))
    assert rows(database_url) == [("a", 1)]


def test_a_transaction_that_ran_no_statement_sends_nothing(pool, table, queries):
    with pool.connection_context():
        queries.clear()
        with pool.atomic():
            pass
        with pytest.raises(RuntimeError), pool.atomic():
            pool.defer("INSERT INTO pool_t VALUES (%s, %s)", ("a", 1))
            raise RuntimeError("given up before anything was sent")
        assert queries == []
        assert pool.execute_sql("SELECT COUNT(*) FROM pool_t").fetchone() == (0,)


def test_a_credit_is_one_round_trip_and_a_second_one_of_the_same_payment_keeps_nothing(database_url, queries):
    from testkit.payments import encode, payload
    from webhooks.payments import ledger
    from webhooks.payments.providers import notifications
    from webhooks.storage.records.db import db
    from webhooks.storage.records.models import Payment, WebhookCall

    if not is_mysql():
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306)")
    raw = encode(payload("paystack", "one-trip-1", 5000, "NGN", "one-trip@example.com"))
    note = notifications.parse("paystack", raw)
    receipt = ledger.receipt("paystack", raw, {"content-type": "application/json"})
    with db.connection_context():
        queries.clear()
        assert ledger.credit(note, receipt) == "credited"
        mine = [sql for conn, sql in queries if conn is db.connection()]
        assert len(mine) == 1, mine  # BEGIN, five INSERTs and the COMMIT
        assert mine[0].startswith("BEGIN; INSERT") and mine[0].endswith("; COMMIT")
        assert ledger.credit(note, receipt) == "duplicate"  # the unique key, inside its transaction
        assert Payment.select().where(Payment.reference == "one-trip-1").count() == 1
        assert ledger.balance("one-trip@example.com", "NGN") == 5000
        verdicts = [d.verdict for d in WebhookCall.select().where(WebhookCall.reference == "one-trip-1")]
        assert sorted(verdicts) == ["credited", "duplicate"]


def test_tls_is_what_the_url_asks_for_and_its_context_is_built_once(pool, database_url):
    """Loopback: no TLS (PyMySQL's default "preferred" would build a TLS context, loading the
    system's certificates, for every new connection). Asked for: one context per process."""
    from webhooks.errors import ConfigError
    from webhooks.storage.records.db import tls_options

    assert tls_options("127.0.0.1", "") == {"ssl_disabled": True} == tls_options("localhost", "")
    assert tls_options("db.internal", "") == {}  # preferred: TLS when the server offers it
    required = tls_options("db.internal", "ssl_mode=REQUIRED")["ssl"]
    assert required is tls_options("db.internal", "ssl-mode=required")["ssl"]
    for bad in ("ssl_mode=sometimes", "ssl_mode=verify_ca"):  # verify_ca needs ssl_ca
        with pytest.raises(ConfigError):
            tls_options("db.internal", bad)
    # the pool on the run's MariaDB (127.0.0.1) connects without TLS
    with pool.connection_context():
        cursor = pool.execute_sql("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        assert cursor.fetchone()[1] == ""


def test_a_free_connection_goes_to_who_asked_first_not_to_who_asked_last(database_url):
    """Callers take turns for a connection: a caller that gives its connection back and asks
    again at once queues behind those already waiting (playhouse's pool let it take the
    connection back, which at 50 requests on 10 connections starved some for seconds)."""
    import threading

    from testkit.servers import wait_until

    if not is_mysql():
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306)")
    one = make_database(database_url, pool_size=1)
    assert isinstance(one, Pool)
    order: list[str] = []

    def ask(name: str) -> None:
        with one.connection_context():
            order.append(name)

    try:
        one.connect()  # this thread holds the only connection
        first = threading.Thread(target=ask, args=("first",))
        first.start()
        wait_until(lambda: one._line.queued == 1, what="the first caller waiting for the connection")
        second = threading.Thread(target=ask, args=("second",))
        second.start()
        wait_until(lambda: one._line.queued == 2, what="the second caller in line behind it")
        one.close()
        one.connect()  # asks again at once: behind both
        order.append("last")
        one.close()
        for t in (first, second):
            t.join(10)
        assert order == ["first", "second", "last"]
    finally:
        one.close_all()


def test_connections_freed_together_let_in_as_many_and_one_that_gave_up_leaves_none_behind(database_url):
    """A caller that waits past the pool's wait leaves the line and nothing of it stays; two
    connections given back let the two callers waiting in, to hold them at the same time; and
    afterwards the pool gives out every connection at once (none left set aside)."""
    import threading

    from playhouse.pool import MaxConnectionsExceeded

    from testkit.servers import wait_until

    if not is_mysql():
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306)")
    two = make_database(database_url, pool_size=2)
    assert isinstance(two, Pool)
    release, both_in = threading.Event(), threading.Barrier(2, timeout=10)
    holding, got_in = [], []

    def hold() -> None:
        with two.connection_context():
            holding.append(threading.get_ident())
            release.wait(10)

    def wait_then_hold(name: str) -> None:
        with two.connection_context():
            got_in.append(name)
            both_in.wait()  # both hold a connection at once

    try:
        holders = [threading.Thread(target=hold) for _ in range(2)]
        for t in holders:
            t.start()
        wait_until(lambda: len(holding) == 2, what="both connections held")
        two._wait_timeout = 0.2
        with pytest.raises(MaxConnectionsExceeded):
            two.connect()  # gives up
        assert two._line.queued == 0
        two._wait_timeout = 10
        waiters = [threading.Thread(target=wait_then_hold, args=(n,)) for n in ("a", "b")]
        for t in waiters:
            t.start()
        wait_until(lambda: two._line.queued == 2, what="two callers in line")
        release.set()
        for t in holders + waiters:
            t.join(10)
        assert sorted(got_in) == ["a", "b"] and not both_in.broken
        for _ in range(2):  # both connections free, none kept for a caller long gone
            two.connect()
            two.close()
        assert two._line.queued == 0 and two._line._set_aside == 0
    finally:
        release.set()
        two.close_all()


@given(st.text())
def test_a_string_is_escaped_exactly_as_pymysql_escapes_it(text):
    assert escape_string(text) == pymysql.converters.escape_string(text)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.datetimes())
def test_a_datetime_is_written_exactly_as_pymysql_writes_it(pool, moment):
    with pool.connection_context():
        conn = pool.connection()
        assert conn.escape(moment) == pymysql.converters.escape_datetime(moment)
        aware = moment.replace(tzinfo=timezone.utc)  # left to PyMySQL, as before
        assert conn.escape(aware) == pymysql.converters.escape_datetime(aware)


@pytest.mark.parametrize("no_backslash_escapes", [False, True])
def test_hostile_text_and_datetimes_reach_the_server_unchanged(pool, no_backslash_escapes):
    hostile = ["", "'", "\\", "\\'", "' OR '1'='1", '"); DROP TABLE t; --', "\0\n\r\x1a\t", "é\u2028😀\\0", "x" * 5000]
    moments = [
        datetime(2026, 12, 3, 12, 0, 0),
        datetime(2026, 12, 3, 12, 0, 0, 1),
        datetime(1000, 1, 1, 0, 0, 0, 999999),
    ]
    with pool.connection_context():
        if no_backslash_escapes:
            pool.execute_sql("SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')")
        try:
            for text in hostile:
                assert pool.execute_sql("SELECT %s", (text,)).fetchone()[0] == text
            for moment in moments:
                got = pool.execute_sql("SELECT CAST(%s AS DATETIME(6))", (moment,)).fetchone()[0]
                assert got == moment
        finally:
            pool.execute_sql("SET SESSION sql_mode = DEFAULT")


# --- a writing node that died: connections its proxy closed (the ledger on a cluster) -------


@pytest.fixture
def proxy(database_url):
    """A TCP proxy before the database: `stop(); start()` drops every connection through it and
    takes new ones, as HAProxy does when it moves from a dead writing node to the next."""
    if not is_mysql():
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306)")
    parts = database_url.split("/")
    host, port = parts[2].rsplit("@", 1)[-1].split(":")
    made = TcpProxy(host, int(port))
    yield made
    made.stop()


def proxied_pool(proxy, database_url, size=4):
    made = make_database(proxy.url_for(database_url), pool_size=size)
    assert isinstance(made, Pool)
    return made


def fill(pool, n):
    """`n` connections made at once and given back: the pool holds `n` idle connections."""
    held, done = threading.Barrier(n + 1), threading.Event()

    def hold():
        with pool.connection_context():
            pool.execute_sql("SELECT 1")
            held.wait(10)
            done.wait(10)

    threads = [threading.Thread(target=hold) for _ in range(n)]
    for t in threads:
        t.start()
    held.wait(10)
    done.set()
    for t in threads:
        t.join(10)
    return [conn for _ts, _n, conn in pool._connections]


def test_no_request_fails_for_the_connections_a_dead_writer_held(proxy, database_url, table, calls, caplog):
    """Every pooled connection points at a writer that dies: once the proxy has moved, 40 reads
    and 40 writes in a row all succeed, and finding the dead connections cost no round trip."""
    pool = proxied_pool(proxy, database_url)
    idle = fill(pool, 4)
    assert len(idle) == 4
    proxy.stop()
    proxy.start()  # the proxy "moved": new connections are taken, the old ones are gone
    wait_until(lambda: all(hung_up(c) for c in idle), timeout=10, what="the old connections' sockets to close")
    for i in range(40):
        with pool.connection_context():
            assert pool.execute_sql("SELECT 1").fetchone() == (1,)
        with pool.connection_context(), pool.atomic():
            pool.execute_sql("INSERT INTO pool_t (k, v) VALUES (%s, %s)", (f"k{i}", i))
    assert len(rows(database_url)) == 40
    assert calls["ping"] == 0
    said = [r.getMessage() for r in caplog.records if r.name == "webhooks.storage.records.db"]
    assert said[0] == "pooled database connections closed by the server or its proxy: replacing them"
    assert re.fullmatch(r"database connections replaced [\d.]+ s after .*; new ones reach .+:\d+", said[1])
    assert len(said) == 2  # once for all the connections, not once for each
    pool.close_all()


def test_a_first_statement_that_meets_a_dead_connection_is_sent_again_when_nothing_of_it_ran(
    proxy, database_url, table
):
    """The proxy drops the connection between its check-out and its first statement (no check can
    see that): a read, or a transaction's first statement with its BEGIN, goes again on a new
    connection; a write outside a transaction may have run and is not sent twice."""
    pool = proxied_pool(proxy, database_url, size=1)
    fill(pool, 1)
    for run in ("read", "transaction", "autocommit write"):
        with pool.connection_context():
            proxy.stop()
            proxy.start()
            wait_until(lambda: hung_up(pool.connection()), timeout=10, what="the connection's socket to close")
            if run == "read":
                assert pool.execute_sql("SELECT 1").fetchone() == (1,)
            elif run == "transaction":
                with pool.atomic():
                    pool.execute_sql("INSERT INTO pool_t (k, v) VALUES ('t', 1)")
                    pool.execute_sql("INSERT INTO pool_t (k, v) VALUES ('u', 2)")
            else:
                with pytest.raises(peewee.OperationalError):
                    pool.execute_sql("INSERT INTO pool_t (k, v) VALUES ('w', 3)")
    assert rows(database_url) == [("t", 1), ("u", 2)]
    pool.close_all()


def cut_at(database_url, marker: bytes) -> tuple[CutProxy, Pool]:
    """A pool of one connection through a proxy that drops it where `marker` is first sent."""
    if not is_mysql():
        pytest.skip("needs MySQL/MariaDB")
    host, port = database_url.split("/")[2].rsplit("@", 1)[-1].split(":")
    cut = CutProxy(host, int(port), marker=marker)
    return cut, make_database(cut.url_for(database_url), pool_size=1)


def test_a_transaction_whose_connection_dies_before_its_commit_is_run_again_whole(database_url, table):
    """The connection dies at the transaction's second statement: nothing of it was kept, and
    `retried` runs it all again on a new connection, once."""
    cut, pool = cut_at(database_url, b"'second'")
    runs = []

    def transaction():
        runs.append(1)
        with pool.atomic():
            pool.execute_sql("INSERT INTO pool_t (k, v) VALUES ('first', 1)")
            pool.execute_sql("INSERT INTO pool_t (k, v) VALUES ('second', 2)")

    with pool.connection_context():
        retried(transaction, "two inserts")
    assert cut.cut.is_set() and len(runs) == 2
    assert rows(database_url) == [("first", 1), ("second", 2)]
    pool.close_all()
    cut.stop()


def test_a_transaction_whose_connection_dies_with_its_commit_is_not_run_again(database_url, table):
    """The connection dies as the COMMIT goes out: whether it was kept is the server's to say,
    so `retried` raises (the caller answers 5xx and its sender retries) and runs nothing twice."""
    cut, pool = cut_at(database_url, b"COMMIT")
    runs = []

    def transaction():
        runs.append(1)
        with pool.atomic():
            pool.execute_sql("INSERT INTO pool_t (k, v) VALUES ('only', 1)")

    with pool.connection_context(), pytest.raises((peewee.OperationalError, peewee.InterfaceError)):
        retried(transaction, "one insert")
    assert cut.cut.is_set() and len(runs) == 1
    assert rows(database_url) == []  # the proxy never let the COMMIT through: rolled back
    pool.close_all()
    cut.stop()
