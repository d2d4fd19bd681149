"""Redis' files on disk after an erasure: every node (each node of a cluster, replicas too)
rewrites its append-only file (BGREWRITEAOF) and saves its snapshot anew (BGSAVE) where it
keeps one, so that no file holds a value Redis no longer does (docs/leads.md "Erasure")."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from webhooks.storage.live.batch import Client

log = logging.getLogger(__name__)

POLL_S = 0.05


class Files(enum.StrEnum):
    """How Redis' files stand after `rewrite`."""

    REWRITTEN = "rewritten"  # every node that keeps files wrote them anew, after the erasure
    NOT_PERSISTED = "not_persisted"  # no node keeps an AOF or a snapshot: nothing on disk
    PENDING = "pending"  # not finished by the deadline (it may still finish): ask again
    FAILED = "failed"  # a node refused or failed (its reason is logged): ask again


@dataclass(frozen=True, kw_only=True)
class Rewrite:
    files: Files
    finished_at: datetime | None  # when the last node was seen done (UTC), if all were


def nodes(clients: Iterable[Client]) -> list[redis.Redis]:
    """One client of each Redis server behind `clients`: every node of a cluster, replicas
    too (CLUSTER NODES names them; redis-py's own node list holds the primaries it routes to)."""
    found: dict[tuple[Any, ...], redis.Redis] = {}
    for client in clients:
        if isinstance(client, RedisCluster):
            for address, detail in client.cluster_nodes().items():
                if "noaddr" in str(detail.get("flags", "")):
                    continue  # a node the cluster knows no address of
                host, _, port = address.rpartition(":")
                node = ClusterNode(host, int(port))
                found[("node", host, int(port))] = client.get_redis_connection(node)
        else:
            kw = client.connection_pool.connection_kwargs
            found[("one", kw.get("host"), kw.get("port"), kw.get("path"), kw.get("db"))] = client
    return list(found.values())


@dataclass(kw_only=True)
class _Node:
    """One server's rewrite: which of its files it keeps, and its counters before we asked."""

    client: redis.Redis
    aof: bool
    rdb: bool
    aof_before: int = 0
    rdb_before: int = 0
    asked: bool = False  # BGREWRITEAOF (and BGSAVE) accepted, after any rewrite already running


def rewrite(clients: Iterable[Client], *, wait_s: float) -> Rewrite:
    """Rewrite the files of every node behind `clients` and wait (`wait_s` at most) until each
    has finished. A node that refuses or fails does not stop the others. Idempotent: asked
    again, each node rewrites again."""
    deadline = time.monotonic() + wait_s
    try:
        pending, failed = _keeping_files(nodes(clients))
    except redis.RedisError as exc:
        log.error("erasure: Redis' nodes could not be listed: %s", exc)
        return Rewrite(files=Files.FAILED, finished_at=None)
    if not pending and not failed:
        return Rewrite(files=Files.NOT_PERSISTED, finished_at=None)
    while pending:
        failed += _step(pending)
        if pending and time.monotonic() >= deadline:
            log.warning("erasure: %d Redis nodes had not rewritten their files in %.0f s", len(pending), wait_s)
            return Rewrite(files=Files.FAILED if failed else Files.PENDING, finished_at=None)
        if pending:
            time.sleep(POLL_S)
    if failed:
        return Rewrite(files=Files.FAILED, finished_at=None)
    return Rewrite(files=Files.REWRITTEN, finished_at=datetime.now(timezone.utc))


def _keeping_files(found: list[redis.Redis]) -> tuple[list[_Node], int]:
    """The nodes that keep an AOF or a snapshot, and how many could not say whether they do."""
    keeping, failed = [], 0
    for client in found:
        try:
            node = _node(client)
        except redis.RedisError as exc:
            log.error("erasure: Redis node %s cannot say which files it keeps: %s", _name(client), exc)
            failed += 1
            continue
        if node.aof or node.rdb:
            keeping.append(node)
    return keeping, failed


def _step(pending: list[_Node]) -> int:
    """Ask each pending node (again) or look whether it is done; those done or failed leave
    `pending`. How many failed."""
    failed = 0
    for node in list(pending):
        try:
            if (node.asked or _ask(node)) and _done(node):
                pending.remove(node)
        except (redis.RedisError, _Failed) as exc:
            log.error("erasure: Redis node %s could not rewrite its files: %s", _name(node.client), exc)
            pending.remove(node)
            failed += 1
    return failed


def _name(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"{kw.get('host')}:{kw.get('port')}" if kw.get("path") is None else str(kw["path"])


class _Failed(Exception):
    """A node's rewrite or save ended in error (INFO says so)."""


def _info(client: redis.Redis) -> dict[str, Any]:
    return dict(client.info("persistence"))


def _node(client: redis.Redis) -> _Node:
    info = _info(client)
    save = client.config_get("save").get("save", "")
    return _Node(client=client, aof=int(info.get("aof_enabled", 0)) == 1, rdb=bool(str(save).strip()))


def _ask(node: _Node) -> bool:
    """Ask `node` for its rewrite (and its save); False while a rewrite or save that began
    before this erasure still runs (it may hold the erased value: ask again once it ended)."""
    info = _info(node.client)
    if int(info.get("aof_rewrite_in_progress", 0)) or int(info.get("rdb_bgsave_in_progress", 0)):
        return False
    node.aof_before, node.rdb_before = int(info.get("aof_rewrites", 0)), int(info.get("rdb_saves", 0))
    try:
        if node.aof:
            node.client.bgrewriteaof()  # "started", or "scheduled" after a save
        if node.rdb:
            node.client.bgsave(schedule=True)  # after the rewrite, if that runs now
    except redis.ResponseError as exc:
        if "already in progress" in str(exc):
            return False  # one began since we looked: ask again once it has ended
        raise
    node.asked = True
    return True


def _done(node: _Node) -> bool:
    info = _info(node.client)
    if node.aof:
        if int(info.get("aof_rewrites", 0)) <= node.aof_before or int(info.get("aof_rewrite_in_progress", 0)):
            return False
        if int(info.get("aof_rewrite_scheduled", 0)):
            return False
        if info.get("aof_last_bgrewrite_status") != "ok":
            raise _Failed(f"AOF rewrite: {info.get('aof_last_bgrewrite_status')}")
    if node.rdb:
        if int(info.get("rdb_saves", 0)) <= node.rdb_before or int(info.get("rdb_bgsave_in_progress", 0)):
            return False
        if info.get("rdb_last_bgsave_status") != "ok":
            raise _Failed(f"snapshot: {info.get('rdb_last_bgsave_status')}")
    return True
