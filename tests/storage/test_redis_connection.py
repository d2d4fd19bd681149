"""The check the Redis pool makes when it hands out a connection (webhooks/storage/redis.py
`Connection.can_read`), made with one poll(2) call: a connection left with an unread reply, or
closed by the server, is still never handed out as it is; an idle one is handed out as it is."""

from __future__ import annotations

import pytest

from webhooks.storage.redis import Connection, make_redis


@pytest.fixture
def client(redis_server):
    if not redis_server.url.startswith("redis://"):
        pytest.skip("a single-node Redis URL")  # a cluster's nodes keep redis-py's own check
    client = make_redis(redis_server.url, max_connections=1)
    yield client
    client.connection_pool.disconnect()


def _only_connection(client) -> Connection:
    conn = client.connection_pool.get_connection()
    client.connection_pool.release(conn)
    assert isinstance(conn, Connection)
    return conn


def test_an_idle_connection_is_handed_out_again_as_it_is(client):
    client.set("fg:test:conn", "1")
    conn = _only_connection(client)
    assert not conn.can_read()
    assert client.get("fg:test:conn") == "1"
    assert _only_connection(client) is conn and conn._sock is not None


def test_a_reply_left_unread_is_never_read_as_the_next_commands(client):
    client.set("fg:test:conn", "mine")
    conn = client.connection_pool.get_connection()
    conn.send_command("GET", "fg:test:conn")  # a caller that went away before reading its reply
    assert conn.can_read(timeout=5)  # the reply has arrived (a wait, not consumed)
    client.connection_pool.release(conn)
    client.set("fg:test:other", "theirs")
    assert client.get("fg:test:other") == "theirs"


def test_a_connection_the_server_closed_is_opened_again(client):
    conn = _only_connection(client)
    own_id = client.client_id()
    helper = make_redis(client.connection_pool.connection_kwargs.get("host") and _url(client))
    helper.client_kill_filter(_id=own_id)
    helper.connection_pool.disconnect()
    assert client.ping() is True
    assert client.client_id() != own_id
    assert _only_connection(client) is conn


def _url(client) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"
