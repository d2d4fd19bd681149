"""The plain seed's settlement job, run by an RQ worker on the queue `plain`:

    rq worker --url $PLAIN_REDIS_URL -w rq.worker.SimpleWorker plain

One ledger row per sold lead, in the database of PLAIN_DATABASE_URL."""

from __future__ import annotations

import json
import os

import pymysql

from bench.plain_seed.db import connect

_conn: pymysql.Connection | None = None


def settle(lead_id: str, publisher_id: str, buyer_id: str, price: str, payload: dict) -> None:
    global _conn
    if _conn is None:
        _conn = connect(os.environ["PLAIN_DATABASE_URL"])
    with _conn.cursor() as cur:
        cur.execute(
            "INSERT INTO leads (lead_id, publisher_id, buyer_id, price, payload) VALUES (%s, %s, %s, %s, %s)",
            (lead_id, publisher_id, buyer_id, price, json.dumps(payload)),
        )
