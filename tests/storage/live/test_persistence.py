"""Redis' files after an erasure (storage/live/persistence.py): every node rewrites its AOF and saves
its snapshot anew, and the answer says how that went. Private redis-servers with real files;
snapshots uncompressed (`rdbcompression no`) so that a value they hold can be found in them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import redis

from testkit.servers import RedisServer
from webhooks.storage.live import persistence
from webhooks.storage.live.persistence import Files

SECRET = "ada.lovelace+erase-me@example.com"
PLAIN = ("--rdbcompression", "no")


@contextmanager
def server(path: Path, *args: str, appendonly: bool = False) -> Iterator[redis.Redis]:
    s = RedisServer(path, appendonly=appendonly, args=(*PLAIN, *args))
    s.start()
    try:
        yield s.client()
    finally:
        s.kill()


def holding(path: Path, needle: str) -> list[str]:
    """The files under `path` whose bytes hold `needle`."""
    return sorted(
        str(f.relative_to(path)) for f in path.rglob("*") if f.is_file() and needle.encode() in f.read_bytes()
    )


def written_then_deleted(client: redis.Redis) -> None:
    client.rpush("fg:settle:pending", f'{{"payload": "{SECRET}"}}', "other")
    client.lpop("fg:settle:pending")  # drained: Redis no longer holds it, its files still do


def test_the_aof_is_rewritten_without_a_value_deleted_before(tmp_path):
    with server(tmp_path, appendonly=True) as client:
        written_then_deleted(client)
        assert holding(tmp_path, SECRET), "the AOF should hold the value before the rewrite"
        before = datetime.now(timezone.utc)
        done = persistence.rewrite([client], wait_s=30)
        assert done.files is Files.REWRITTEN
        assert done.finished_at is not None and done.finished_at >= before
        assert holding(tmp_path, SECRET) == []
        assert client.lrange("fg:settle:pending", 0, -1) == ["other"]  # the data itself stays


def test_a_snapshot_is_saved_anew_without_a_value_deleted_before(tmp_path):
    with server(tmp_path, "--save", "3600 1") as client:
        written_then_deleted(client)
        client.rpush("fg:settle:pending", SECRET)
        client.save()
        client.delete("fg:settle:pending")
        assert holding(tmp_path, SECRET) == ["dump.rdb"]
        done = persistence.rewrite([client], wait_s=30)
        assert done.files is Files.REWRITTEN and done.finished_at is not None
        assert holding(tmp_path, SECRET) == []


def test_a_redis_that_keeps_no_files_is_said_to(tmp_path):
    with server(tmp_path) as client:
        assert persistence.rewrite([client], wait_s=30) == persistence.Rewrite(
            files=Files.NOT_PERSISTED, finished_at=None
        )


def test_a_node_that_refuses_the_rewrite_is_reported_failed_and_the_others_still_rewrite(tmp_path):
    with (
        server(tmp_path / "a", "--rename-command", "BGREWRITEAOF", "", appendonly=True) as refusing,
        server(tmp_path / "b", appendonly=True) as good,
    ):
        written_then_deleted(good)
        done = persistence.rewrite([good, refusing], wait_s=30)
        assert done == persistence.Rewrite(files=Files.FAILED, finished_at=None)
        assert holding(tmp_path / "b", SECRET) == []


def test_a_rewrite_not_finished_in_time_is_pending_and_asking_again_finishes_it(tmp_path):
    # 200 keys at 20 ms each: the rewrite takes 4 s at least, on any machine
    with server(tmp_path, "--rdb-key-save-delay", "20000", appendonly=True) as client:
        client.mset({f"k{i}": i for i in range(200)})
        written_then_deleted(client)
        assert persistence.rewrite([client], wait_s=0.2) == persistence.Rewrite(files=Files.PENDING, finished_at=None)
        client.config_set("rdb-key-save-delay", 0)
        # asked again while the first still runs: it waits for it, then rewrites once more
        again = persistence.rewrite([client], wait_s=60)
        assert again.files is Files.REWRITTEN
        assert client.info("persistence")["aof_rewrites"] == 2
        assert holding(tmp_path, SECRET) == []
