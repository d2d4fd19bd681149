"""A Batch on one Redis is written and read on a pooled connection itself (storage/live/batch.py
`_send_on`), not through redis-py's Pipeline, which a cluster and a client whose connections
retry keep: both paths must read every reply alike, raise an error reply after reading the
rest, keep MULTI/EXEC's all-or-nothing, and leave no reply on a connection cut off mid-batch."""

from __future__ import annotations

import signal

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from webhooks.storage.live.batch import Batch, _send_on
from webhooks.storage.live.redis import make_redis


def _single_node(redis_server) -> str:
    if not redis_server.url.startswith("redis://"):
        pytest.skip("a single-node Redis URL")  # a cluster keeps redis-py's pipeline
    return redis_server.url


@pytest.fixture(params=["own path", "redis-py pipeline"])
def client(request, redis_server):
    url = _single_node(redis_server)
    if request.param == "own path":
        client = make_redis(url, max_connections=1)
    else:  # connections that retry: the batch goes through redis-py's pipeline
        client = redis.Redis.from_url(url, decode_responses=True, retry=Retry(NoBackoff(), 1), max_connections=1)
    client.delete("fg:test:b:s", "fg:test:b:n", "fg:test:b:l", "fg:test:b:h", "fg:test:b:gone")
    yield client
    client.connection_pool.disconnect()


def test_retrying_connections_are_what_sends_a_batch_through_redis_pys_pipeline(redis_server):
    url = _single_node(redis_server)
    own = make_redis(url).connection_pool.get_connection()
    retrying = redis.Redis.from_url(url, retry=Retry(NoBackoff(), 1)).connection_pool.get_connection()
    assert own.retry.get_retries() == 0 and retrying.retry.get_retries() == 1


class NoPipeline(redis.Redis):
    def pipeline(self, transaction=True, shard_hint=None):
        raise AssertionError("a batch on one Redis went through redis-py's Pipeline")


@pytest.mark.parametrize("atomic", [False, True])
def test_a_batch_on_one_redis_builds_no_pipeline(redis_server, atomic):
    pool = make_redis(_single_node(redis_server)).connection_pool
    with Batch(NoPipeline(connection_pool=pool), atomic=atomic) as b:
        got = b.get("fg:test:b:gone")
        pushed = b.lpush("fg:test:b:l", "x")
    assert got.value is None and pushed.value >= 1
    pool.disconnect()


@pytest.mark.parametrize("atomic", [False, True])
def test_every_command_reads_its_own_reply(client, atomic):
    client.hset("fg:test:b:h", mapping={"a": "1", "b": "2"})
    client.set("fg:test:b:n", 5)
    with Batch(client, atomic=atomic) as b:
        first = b.set("fg:test:b:s", "v", px=60_000, nx=True)
        again = b.set("fg:test:b:s", "w", nx=True)
        got = b.get("fg:test:b:s")
        missing = b.get("fg:test:b:gone")
        pushed = b.lpush("fg:test:b:l", "x", "y")
        fields = b.hmget("fg:test:b:h", ["a", "zz", "b"])
        field = b.hget("fg:test:b:h", "b")
        lower = b.decr("fg:test:b:n")
        there = b.exists("fg:test:b:s", "fg:test:b:gone", "fg:test:b:l")
        gone = b.delete("fg:test:b:l", "fg:test:b:gone")
    assert first.value is True and again.value is None
    assert got.value == "v" and missing.value is None
    assert pushed.value == 2 and fields.value == ["1", None, "2"] and field.value == "2"
    assert lower.value == 4 and there.value == 2 and gone.value == 1
    assert 0 < client.pttl("fg:test:b:s") <= 60_000


def test_a_reply_is_not_there_before_its_batch_is_sent(client):
    b = Batch(client)
    got = b.get("fg:test:b:s")
    with pytest.raises(RuntimeError, match="not been sent"):
        _ = got.value


def test_an_empty_batch_sends_nothing(client, redis_server):
    own_id = client.client_id()  # the pool's one connection, whose last command this is now
    Batch(client).execute()
    Batch(client, atomic=True).execute()
    # asked of this connection alone (the server's own count would take in every other client's
    # commands meanwhile: a web process's journal, an idle worker)
    watcher = redis.Redis.from_url(_single_node(redis_server), decode_responses=True)
    try:
        (seen,) = watcher.client_list(client_id=[own_id])
    finally:
        watcher.close()
    assert seen["cmd"] == "client|id"


def test_an_error_reply_is_raised_after_the_rest_of_the_batch_ran_and_was_read(client):
    own_id = client.client_id()
    client.set("fg:test:b:s", "not a number")
    b = Batch(client)
    b.decr("fg:test:b:s")
    after = b.lpush("fg:test:b:l", "secret-value")
    with pytest.raises(redis.ResponseError) as raised:
        b.execute()
    assert "command #1 (DECRBY) of a batch" in str(raised.value)
    assert "secret-value" not in str(raised.value)  # a command's arguments are never in the message
    assert client.lrange("fg:test:b:l", 0, -1) == ["secret-value"]  # a plain batch is not all or nothing
    with pytest.raises(RuntimeError):
        _ = after.value  # not filled: the batch raised
    assert client.client_id() == own_id  # every reply read: the same connection serves on


def test_an_atomic_batch_runs_around_an_error_at_run_time(client):
    # Redis has no rollback: MULTI/EXEC guards against a batch half sent, not a command that fails
    client.set("fg:test:b:s", "not a number")
    b = Batch(client, atomic=True)
    b.lpush("fg:test:b:l", "x")
    b.decr("fg:test:b:s")
    with pytest.raises(redis.ResponseError, match=r"command #2 \(DECRBY\)"):
        b.execute()
    assert client.llen("fg:test:b:l") == 1


def test_a_command_redis_refuses_to_queue_discards_the_whole_transaction(redis_server):
    client = make_redis(_single_node(redis_server), max_connections=1)
    client.delete("fg:test:b:l")
    conn = client.connection_pool.get_connection()
    try:
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            _send_on(conn, [("LPUSH", "fg:test:b:l", "x"), ("GET",)], atomic=True)
        conn.send_command("LLEN", "fg:test:b:l")  # the same connection, in step
        assert conn.read_response() == 0  # the LPUSH queued before the refused command never ran
    finally:
        client.connection_pool.release(conn)
        client.connection_pool.disconnect()


class Deadline(BaseException):
    """What a request's deadline raises in the middle of a round trip (gevent.Timeout is one too)."""


@pytest.mark.parametrize("atomic", [False, True])
def test_a_batch_cut_off_by_a_deadline_leaves_no_reply_for_the_next(redis_server, atomic):
    client = make_redis(_single_node(redis_server), max_connections=1)
    client.delete("fg:test:b:l")

    def cut_off(_signum, _frame):
        raise Deadline

    previous = signal.signal(signal.SIGALRM, cut_off)
    try:
        conn = client.connection_pool.get_connection()
        if atomic:  # in MULTI, BLPOP does not block: Redis holds every command back for 2 s
            make_redis(redis_server.url).execute_command("CLIENT", "PAUSE", 2000, "ALL")
        try:
            with pytest.raises(Deadline):
                signal.setitimer(signal.ITIMER_REAL, 0.2)  # while its replies are 2 or 5 s away
                _send_on(conn, [("PING",), ("BLPOP", "fg:test:b:l", 5), ("LLEN", "fg:test:b:l")], atomic=atomic)
        finally:
            client.connection_pool.release(conn)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    try:
        client.rpush("fg:test:b:l", "for another caller")  # a cut-off BLPOP must not take it
        with Batch(client, atomic=atomic) as b:
            rest = b.hmget("fg:test:b:l:none", ["f"])
            length = b.exists("fg:test:b:l")
        assert rest.value == [None] and length.value == 1  # its own replies, not the cut-off ones
        assert client.lrange("fg:test:b:l", 0, -1) == ["for another caller"]
    finally:
        client.connection_pool.disconnect()
