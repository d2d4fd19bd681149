"""What MariaDB reads for a piece of work, from its session's Handler counters: rows and index
entries read, those an index condition pushed down to InnoDB looked at included. A read served
by its index stays small however large the table; a scan grows with it."""

from __future__ import annotations

from collections.abc import Callable

from webhooks.storage.records.db import db

COUNTERS = ("Handler_read_next", "Handler_read_prev", "Handler_read_rnd_next", "Handler_icp_attempts")


def rows_read(work: Callable[[], object]) -> int:
    """Run `work` on the current connection (inside `db.connection_context()`): what it read."""

    def read() -> int:
        marks = ", ".join(["%s"] * len(COUNTERS))
        rows = db.execute_sql(f"SHOW SESSION STATUS WHERE Variable_name IN ({marks})", COUNTERS).fetchall()
        return sum(int(n) for _name, n in rows)

    before = read()
    work()
    return read() - before
