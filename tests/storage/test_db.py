"""The MySQL connection pool (storage/db.py Pool) on the real MariaDB: no ping and no rollback
per request, yet a transaction left open is rolled back on check-in and a connection the server
closed is not handed out again."""

from __future__ import annotations

import pymysql
import pytest

from webhooks.storage.db import Pool, is_mysql, make_database


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


def test_a_connection_the_server_closed_is_replaced_once_idle_long_enough_to_be_pinged(pool, database_url, monkeypatch):
    pool.connect()
    first = pool.connection()
    thread_id = first.thread_id()
    pool.close()
    killer = make_database(database_url, pool_size=1)
    with killer.connection_context():
        killer.execute_sql(f"KILL CONNECTION {int(thread_id)}")
    killer.close_all()
    monkeypatch.setattr(Pool, "PING_AFTER_S", 0.0)  # idle "long enough": pinged on check-out
    with pool.connection_context():
        assert pool.connection() is not first
        assert pool.execute_sql("SELECT 1").fetchone() == (1,)
