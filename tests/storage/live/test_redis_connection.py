"""The check the Redis pool makes when it hands out a connection (webhooks/storage/live/redis.py
`Connection.can_read`), made with one poll(2) call: a connection left with an unread reply, or
closed by the server, is still never handed out as it is; an idle one is handed out as it is.
And the Store's scripts' own path to a connection (`_send`): a command cut off before its
reply leaves no reply behind for the next one."""

from __future__ import annotations

import signal
import threading

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from testkit.servers import wait_until
from webhooks.storage.live.redis import Connection, _send, make_redis


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


class Deadline(BaseException):
    """What a request's deadline raises in the middle of a command (gevent.Timeout is one too)."""


def test_a_command_cut_off_by_a_deadline_leaves_no_reply_for_the_next(client):
    client.delete("fg:test:list")

    def cut_off(_signum, _frame):
        raise Deadline

    previous = signal.signal(signal.SIGALRM, cut_off)
    try:
        with pytest.raises(Deadline):
            signal.setitimer(signal.ITIMER_REAL, 0.2)  # while BLPOP waits: its reply comes 5 s later
            _send(client, ("BLPOP", "fg:test:list", 5))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    client.rpush("fg:test:list", "for another caller")  # the cut-off BLPOP must not take it
    assert _send(client, ("LRANGE", "fg:test:list", 0, -1)) == ["for another caller"]


def test_a_command_that_times_out_leaves_no_reply_for_the_next(redis_server):
    if not redis_server.url.startswith("redis://"):
        pytest.skip("a single-node Redis URL")
    client = make_redis(redis_server.url, max_connections=1)
    client.connection_pool.connection_kwargs["socket_timeout"] = 0.2
    try:
        client.delete("fg:test:list")
        with pytest.raises(redis.TimeoutError):
            _send(client, ("BLPOP", "fg:test:list", 5))  # the reply, nil, comes after 5 s
        assert _send(client, ("RPUSH", "fg:test:list", "x")) == 1  # not BLPOP's late nil
        assert _send(client, ("LLEN", "fg:test:list")) == 1
    finally:
        client.connection_pool.disconnect()


def test_an_error_reply_leaves_the_connection_open(client):
    own_id = client.client_id()
    with pytest.raises(redis.ResponseError):
        _send(client, ("INCR", "fg:test:counter", "one argument too many"))
    assert client.client_id() == own_id  # the same connection, not one opened again


def test_a_client_whose_connections_retry_sends_the_command_again(redis_server):
    if not redis_server.url.startswith("redis://"):
        pytest.skip("a single-node Redis URL")
    retrying = redis.Redis.from_url(redis_server.url, decode_responses=True, retry=Retry(NoBackoff(), 1))
    helper = make_redis(redis_server.url)
    helper.delete("fg:test:retried")

    def waiting() -> list[int]:
        return [c["id"] for c in helper.client_list() if c["cmd"] == "blpop"]

    def cut_then_push() -> None:
        wait_until(lambda: waiting(), timeout=10, what="the first BLPOP waiting")
        first = waiting()[0]
        helper.client_kill_filter(_id=first)
        wait_until(lambda: waiting() and waiting() != [first], timeout=10, what="the BLPOP sent again")
        helper.rpush("fg:test:retried", "x")

    other = threading.Thread(target=cut_then_push)
    other.start()
    try:
        assert list(_send(retrying, ("BLPOP", "fg:test:retried", 10))) == ["fg:test:retried", "x"]
    finally:
        other.join()
        retrying.connection_pool.disconnect()
        helper.connection_pool.disconnect()
