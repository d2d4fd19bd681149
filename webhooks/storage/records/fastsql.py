"""INSERTs for the hottest transactions (a payment's credit, a batch of audit rows), without
peewee building the statement each time: the SQL for a model and a set of columns is made once
and kept; the values still go through each field's `db_value`, so they are stored exactly as
peewee's own `Model.insert(...)` would store them. The first-delivery profile
(bench/profile.py) showed peewee's query building (its AST, `Field.__hash__`, `Entity.__sql__`)
as a fair share of a credit's CPU."""

from __future__ import annotations

from typing import Any

import peewee as pw

from webhooks.storage.records.db import Pool, db

_STATEMENTS: dict[tuple[type[pw.Model], tuple[str, ...], str], tuple[str, list[pw.Field]]] = {}


def _statement(model: type[pw.Model], names: tuple[str, ...]) -> tuple[str, list[pw.Field]]:
    database = db.obj
    key = (model, names, type(database).__name__)
    found = _STATEMENTS.get(key)
    if found is None:
        fields = [model._meta.fields[name] for name in names]
        open_q, close_q = database.quote[0], database.quote[1]
        columns = ", ".join(f"{open_q}{f.column_name}{close_q}" for f in fields)
        table = f"{open_q}{model._meta.table_name}{close_q}"
        marks = ", ".join([database.param] * len(fields))
        found = _STATEMENTS[key] = (f"INSERT INTO {table} ({columns}) VALUES ({marks})", fields)
    return found


def _default(f: pw.Field) -> Any:
    """The model's default of field `f` (called when it is a function), as peewee fills it."""
    return f.default() if callable(f.default) else f.default


def insert(model: type[pw.Model], row: dict[str, Any], deferred: bool = False) -> None:
    """INSERT one row of `model` (keys: field names; the model's defaults fill the others, as
    peewee's insert does), in the caller's transaction. Raises peewee's IntegrityError on a
    duplicate key, as `Model.insert(...).execute()` does. `deferred` (MySQL): the INSERT is sent
    with the transaction's next statement or its commit, and so is its error (db.py Pool)."""
    full = dict(row)
    for f in model._meta.sorted_fields:
        if f.name not in full and f.default is not None:
            full[f.name] = _default(f)
    sql, fields = _statement(model, tuple(full))
    values = [f.db_value(full[f.name]) for f in fields]  # type: ignore[no-untyped-call]
    if deferred and isinstance(db.obj, Pool):
        db.obj.defer(sql, values)
    else:
        db.execute_sql(sql, values)


def insert_many(model: type[pw.Model], rows: list[dict[str, Any]]) -> None:
    """INSERT `rows` of `model` with one statement (keys: field names; a field a row leaves out
    takes the model's default, else NULL), as `Model.insert_many(rows).execute()` stores them,
    in the caller's transaction. The settlement drain writes queued webhook-call audit rows
    this way, fifty at a time: peewee building that statement was a fifth of its CPU."""
    if not rows:
        return
    unknown = {k for r in rows for k in r} - set(model._meta.fields)
    if unknown:
        raise ValueError(f"no such field of {model.__name__}: {sorted(unknown)}")
    fields = model._meta.sorted_fields
    names = tuple(f.name for f in fields if not f.primary_key or any(f.name in r for r in rows))
    sql, chosen = _statement(model, names)
    head, _, one = sql.partition(" VALUES ")
    values = [
        f.db_value(row[f.name] if f.name in row else _default(f))  # type: ignore[no-untyped-call]
        for row in rows
        for f in chosen
    ]
    db.execute_sql(f"{head} VALUES {', '.join([one] * len(rows))}", values)
