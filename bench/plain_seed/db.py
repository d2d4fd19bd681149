"""The plain seed's database: its own tiny schema in a MySQL/MariaDB database named by a URL,
and a small pool of PyMySQL connections (cooperative under gevent, which patches `queue`)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

import pymysql

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS payments (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        reference VARCHAR(100) NOT NULL UNIQUE,
        amount BIGINT NOT NULL,
        customer VARCHAR(255) NOT NULL,
        status VARCHAR(20) NOT NULL,
        created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP)""",
    """CREATE TABLE IF NOT EXISTS wallets (
        customer VARCHAR(255) PRIMARY KEY,
        balance BIGINT NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS leads (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        lead_id VARCHAR(100) NOT NULL,
        publisher_id VARCHAR(50) NOT NULL,
        buyer_id VARCHAR(50) NOT NULL,
        price DECIMAL(10, 2) NOT NULL,
        payload TEXT NOT NULL,
        created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
        KEY (lead_id))""",
)


def connect(url: str) -> pymysql.Connection:
    p = urlparse(url)
    return pymysql.connect(
        host=p.hostname,
        port=p.port or 3306,
        user=p.username or "root",
        password=p.password or "",
        database=p.path.lstrip("/"),
        autocommit=True,
    )


def create_schema(url: str) -> None:
    conn = connect(url)
    with conn.cursor() as cur:
        for statement in SCHEMA:
            cur.execute(statement)
    conn.close()


class Pool:
    """Up to `size` open connections, handed out one per transaction."""

    def __init__(self, url: str, size: int = 10):
        self.url = url
        self.idle: queue.LifoQueue = queue.LifoQueue()
        self.slots = queue.Queue()
        for _ in range(size):
            self.slots.put(None)

    @contextmanager
    def transaction(self) -> Iterator[pymysql.cursors.Cursor]:
        self.slots.get()
        try:
            try:
                conn = self.idle.get_nowait()
            except queue.Empty:
                conn = connect(self.url)
            try:
                conn.begin()
                with conn.cursor() as cur:
                    yield cur
                conn.commit()
            except BaseException:
                conn.close()  # rolled back by the server; a broken connection is not reused
                raise
            self.idle.put(conn)
        finally:
            self.slots.put(None)
