"""The embedded SQLite ledger (storage/records/db.py SQLite) holds under several writers, and the
ledger's fields read back the same types and values on SQLite as on MariaDB."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import peewee
import pytest

from testkit.servers import wait_until
from webhooks.storage.records.db import SQLite, is_mysql, make_database
from webhooks.storage.records.models import DateTime6Field, DecimalField

ROOT = Path(__file__).resolve().parents[3]


class Row(peewee.Model):
    """A table of the ledger's own field types (made and dropped by the fixture)."""

    key = peewee.CharField(max_length=20, primary_key=True)
    amount = DecimalField(max_digits=14, decimal_places=2, default=0)
    at = DateTime6Field(null=True)

    class Meta:
        table_name = "fg_types_t"


@pytest.fixture
def sqlite_db(tmp_path) -> Iterator[SQLite]:
    made = make_database(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    assert isinstance(made, SQLite)
    with made.bind_ctx([Row]):
        made.create_tables([Row])
        yield made
    made.close()


@pytest.fixture(params=["sqlite", "mysql"])
def ledger(request, tmp_path, database_url) -> Iterator[peewee.Database]:
    """A database of each kind: SQLite always, MariaDB when one answers."""
    if request.param == "mysql":
        if not is_mysql():
            pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306)")
        made = make_database(database_url, pool_size=2)
    else:
        made = make_database(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    with made.bind_ctx([Row]), made.connection_context():
        made.create_tables([Row])
        try:
            yield made
        finally:
            made.drop_tables([Row])
    made.close()


def test_money_reads_back_with_its_places_however_the_database_added_it(ledger):
    Row.insert_many([{"key": "whole", "amount": "2.00"}, {"key": "sum", "amount": "0.10"}]).execute()
    for _ in range(2):
        Row.update(amount=Row.amount + Decimal("0.10")).where(Row.key == "sum").execute()
    got = {r.key: r.amount for r in Row.select()}
    assert got == {"whole": Decimal("2.00"), "sum": Decimal("0.30")}
    assert [str(v) for _k, v in sorted(got.items())] == ["0.30", "2.00"]  # not "0.30000000000000004", "2"


def test_a_datetime_reads_back_naive_utc_whether_it_was_written_aware_or_naive(ledger):
    naive = datetime(2026, 4, 1, 9, 30, 0, 123456)
    Row.insert_many(
        [
            {"key": "naive", "at": naive},
            {"key": "utc", "at": naive.replace(tzinfo=timezone.utc)},
            {"key": "paris", "at": (naive + timedelta(hours=2)).replace(tzinfo=timezone(timedelta(hours=2)))},
            {"key": "whole", "at": naive.replace(microsecond=0).replace(tzinfo=timezone.utc)},
        ]
    ).execute()
    got = {r.key: r.at for r in Row.select()}
    assert got == {"naive": naive, "utc": naive, "paris": naive, "whole": naive.replace(microsecond=0)}
    assert all(at.tzinfo is None for at in got.values())
    # compared by the database in UTC, whichever zone the bound is given in
    later = naive.replace(tzinfo=timezone.utc) + timedelta(microseconds=1)
    assert {r.key for r in Row.select().where(Row.at < later)} == {"naive", "utc", "paris", "whole"}
    assert {r.key for r in Row.select().where(Row.at >= naive.replace(tzinfo=timezone.utc))} == {
        "naive",
        "utc",
        "paris",
    }


def test_a_transaction_holds_the_write_lock_from_its_begin(sqlite_db, tmp_path):
    """A transaction that reads, then writes, never fails "database is locked" for a write
    another process made in between: that write waits for the transaction instead."""
    other = sqlite3.connect(tmp_path / "ledger.sqlite3", timeout=0, isolation_level=None)  # another process
    with sqlite_db.connection_context():
        with sqlite_db.atomic():
            assert Row.select().count() == 0
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("INSERT INTO fg_types_t (key, amount) VALUES ('theirs', 1)")
            Row.insert(key="mine", amount="1.00").execute()
        other.execute("INSERT INTO fg_types_t (key, amount) VALUES ('theirs', 1)")  # free again
        assert sorted(r.key for r in Row.select()) == ["mine", "theirs"]
    other.close()


def test_a_write_waits_for_another_process_s_transaction_to_end(sqlite_db, tmp_path):
    other = sqlite3.connect(tmp_path / "ledger.sqlite3", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO fg_types_t (key, amount) VALUES ('theirs', 1)")
    errors: list[BaseException] = []
    trying = threading.Event()

    def write() -> None:
        try:
            with sqlite_db.connection_context():
                trying.set()  # before its BEGIN: whether that waits or not, it must not fail
                with sqlite_db.atomic():
                    Row.insert(key="mine", amount="1.00").execute()
        except BaseException as exc:  # reported below
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    wait_until(trying.is_set, what="the writer about to begin")
    other.execute("COMMIT")
    writer.join(timeout=SQLite.BUSY_TIMEOUT_MS / 1000)
    assert not writer.is_alive() and errors == []
    with sqlite_db.connection_context():
        assert sorted(r.key for r in Row.select()) == ["mine", "theirs"]
    other.close()


def test_writers_of_one_thread_pool_take_turns_and_none_fails(sqlite_db):
    """Twenty threads at once, each adding to one balance in a transaction that reads it first:
    none fails, no addition is lost."""

    def add(_i: int) -> None:
        with sqlite_db.connection_context(), sqlite_db.atomic():
            row = Row.get_or_none(Row.key == "balance")
            if row is None:
                Row.insert(key="balance", amount="0.10").execute()
            else:
                Row.update(amount=row.amount + Decimal("0.10")).where(Row.key == "balance").execute()

    with ThreadPoolExecutor(20) as pool:
        list(pool.map(add, range(20)))  # raises the first failure
    with sqlite_db.connection_context():
        assert Row.get(Row.key == "balance").amount == Decimal("2.00")


GEVENT_WRITERS = textwrap.dedent(
    """
    from gevent import monkey

    monkey.patch_all()

    import sys, time

    import gevent
    import peewee

    from webhooks.storage.records.db import SQLite
    from webhooks.storage.records.models import DecimalField

    SQLite.BUSY_TIMEOUT_MS = 3000  # a wait that blocked the process would fail within it
    database = SQLite(sys.argv[1])

    class Row(peewee.Model):
        key = peewee.CharField(max_length=20, primary_key=True)
        amount = DecimalField(max_digits=14, decimal_places=2)

        class Meta:
            database = database
            table_name = "fg_types_t"

    database.create_tables([Row])

    def in_transaction():  # yields in the middle, as a Redis call there would
        with database.connection_context(), database.atomic():
            Row.insert(key="in", amount="1.00").execute()
            gevent.sleep(0)
            Row.update(amount="2.00").where(Row.key == "in").execute()

    def alone():  # a write outside a transaction, run while the other is open
        with database.connection_context():
            Row.insert(key="alone", amount="3.00").execute()

    started = time.monotonic()
    jobs = [gevent.spawn(in_transaction), gevent.spawn(alone), gevent.spawn(in_transaction)]
    gevent.joinall(jobs)
    for job in jobs:
        if job.exception is not None:
            print(type(job.exception).__name__, job.exception)
    with database.connection_context():
        print(sorted((r.key, str(r.amount)) for r in Row.select()), round(time.monotonic() - started, 1))
    """
)


def test_greenlets_of_a_gevent_worker_take_turns_instead_of_blocking_the_process(tmp_path):
    """In a web worker SQLite's wait for the write lock would stop every greenlet, the one
    holding the lock too: the writers of a process wait on a gevent lock instead."""
    path = tmp_path / "ledger.sqlite3"
    done = subprocess.run(
        [sys.executable, "-c", GEVENT_WRITERS, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    *failures, last = done.stdout.strip().splitlines()
    # the second in_transaction fails on its duplicate key, after its turn: nothing else fails
    assert failures == ["IntegrityError UNIQUE constraint failed: fg_types_t.key"]
    rows, seconds = last.rsplit(" ", 1)
    assert rows == "[('alone', '3.00'), ('in', '2.00')]"
    assert float(seconds) < 2.0
