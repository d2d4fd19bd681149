"""Redis clients: bounded, blocking connection pools (gevent-safe), short timeouts so an
unreachable Redis becomes a fast 503 rather than a hung request.

A `redis+cluster://host:port` (or `rediss+cluster://`) URL names a Redis Cluster through any
one of its nodes: the client is then redis-py's RedisCluster, which discovers the others and
keeps one bounded pool per node. Every Lua script touches the keys of one hash slot, and
non-transactional pipelines may mix slots (redis-py splits them per node), so the rest of
the code does not care which kind of client it holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import redis
from redis.cluster import ClusterPipeline, RedisCluster
from redis.commands.core import Script
from redis.exceptions import ClusterError, RedisClusterException, SlotNotCoveredError, TryAgainError

import lua
from webhooks.storage import keys

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# redis-py errors that mean "Redis is not answering": the caller answers 503. The cluster ones
# are a failover in progress (CLUSTERDOWN, TRYAGAIN, a slot without a node, retries used up).
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ClusterError,
              TryAgainError, SlotNotCoveredError)


class ClusterUnreachable(redis.ConnectionError):
    """No node of the cluster answers (redis-py says so with a RedisClusterException, the
    class it also uses for programming errors such as keys of several slots in one script)."""


def _unreachable(exc: RedisClusterException) -> bool:
    return isinstance(exc.__cause__, (redis.ConnectionError, redis.TimeoutError))


class Cluster(RedisCluster):
    """redis-py's RedisCluster, with an unreachable cluster reported as a ConnectionError (a
    503, like an unreachable single Redis, while a CROSSSLOT bug stays a 500), and `ping` and
    `keys` covering every slot (as on one Redis) rather than one or every node."""

    def execute_command(self, *args, **kwargs):
        try:
            return super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            if _unreachable(exc):
                raise ClusterUnreachable(str(exc)) from exc
            raise

    def ping(self, **kwargs) -> bool:
        """PING every primary. redis-py pings every node, replicas too: a replica down would
        then make each web process unready although every lead can still be routed."""
        return super().ping(target_nodes=self.PRIMARIES, **kwargs)

    def keys(self, pattern: str = "*", **kwargs) -> list:
        """KEYS of every primary, as on one Redis (redis-py asks one node only)."""
        return super().keys(pattern, target_nodes=self.PRIMARIES, **kwargs)


@dataclass(frozen=True)
class ReplicaWait:
    """How many replicas must hold a cap reservation before its lead is delivered, and how
    long to wait for them (CAP_WAIT_REPLICAS, CAP_WAIT_TIMEOUT_MS). 0 replicas: no waiting."""

    replicas: int = 0
    timeout_ms: int = 100


class RateDecision(NamedTuple):
    """A publisher's token bucket's answer: `allowed`, else `wait_ms` until its next token."""

    allowed: bool
    wait_ms: int


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0] in CLUSTER_SCHEMES


def make_redis(url: str, max_connections: int = 64) -> redis.Redis | RedisCluster:
    """A client of `url`: bounded, blocking pools, short timeouts. For a cluster,
    `max_connections` bounds each node's pool."""
    options = {"max_connections": max_connections, "timeout": 5, "socket_timeout": 2,
               "socket_connect_timeout": 1, "decode_responses": True}
    scheme, rest = url.split("://", 1)
    if scheme in CLUSTER_SCHEMES:
        # `timeout` is the BlockingConnectionPool's wait for a free connection (per node).
        try:
            return Cluster.from_url(f"{CLUSTER_SCHEMES[scheme]}://{rest}",
                                    connection_pool_class=redis.BlockingConnectionPool, **options)
        except RedisClusterException as exc:
            if _unreachable(exc):
                raise ClusterUnreachable(str(exc)) from exc
            raise
    pool = redis.BlockingConnectionPool.from_url(url, health_check_interval=30, **options)
    return redis.Redis(connection_pool=pool)


class Store:
    """A Redis client (one server or a cluster) with Floodgate's Lua scripts registered on it
    once, as typed attributes (the way alisaifee/limits' RedisStorage keeps its scripts).
    `redis` takes every plain command; `cap_wait` is how many replicas must hold a cap
    reservation before its lead is delivered."""

    def __init__(self, client: redis.Redis | RedisCluster, cap_wait: ReplicaWait = ReplicaWait()):
        self.redis = client
        self.cap_wait = cap_wait
        self.adjust_counter = self._register("adjust_counter")
        self.answer_lead = self._register("answer_lead")
        self.claim_lead = self._register("claim_lead")
        self.claim_or_get = self._register("claim_or_get")
        self.extend_lease = self._register("extend_lease")
        self.finish_lease = self._register("finish_lease")
        self.finish_payment = self._register("finish_payment")
        self.give_back = self._register("give_back")
        self.payment_gate = self._register("payment_gate")
        self.rebuild_counters = self._register("rebuild_counters")
        self.release_claim = self._register("release_claim")
        self.reserve_lease = self._register("reserve_lease")
        self.restore_answer = self._register("restore_answer")
        self.snapshot_caps = self._register("snapshot_caps")
        self.take_batch = self._register("take_batch")
        self._take_token = self._register("take_token")

    def _register(self, name: str) -> Script:
        return self.redis.register_script(lua.source(name))

    def take_token(self, publisher_id: str, per_second: int, burst: int) -> RateDecision:
        """One token of the publisher's bucket (lua/take_token.lua), in one round trip."""
        allowed, wait_ms = self._take_token(keys=[keys.rate_bucket(publisher_id)], args=[per_second, burst])
        return RateDecision(allowed == 1, int(wait_ms))

    def queue(self, pipe, script: Script, keys: list, args: list) -> None:
        """Add a script call to a pipeline. EVAL, not EVALSHA: redis-py would otherwise check
        SCRIPT EXISTS in an extra round trip on every pipeline (Redis caches the script).
        A raw command, as redis-py's cluster pipeline has no `eval` method. There it is sent
        to the node of its first key: left to find the node itself, that pipeline asks a node
        which keys the EVAL has (COMMAND GETKEYS, with the whole script) in a round trip of
        its own. A stale node answers MOVED, which the pipeline follows."""
        options = {"target_nodes": pipe.get_node_from_key(keys[0])} if isinstance(pipe, ClusterPipeline) else {}
        pipe.execute_command("EVAL", script.script, len(keys), *keys, *args, **options)


def make_store(url: str, max_connections: int = 64, wait_replicas: int = 0,
               wait_timeout_ms: int = 100) -> Store:
    """A Store on a new client of `url` (see make_redis)."""
    return Store(make_redis(url, max_connections), ReplicaWait(wait_replicas, wait_timeout_ms))


def node_of(client: redis.Redis | RedisCluster, key: str) -> redis.Redis:
    """A plain client of the node that serves `key` (the client itself when not a cluster):
    for commands that must share one connection with a write, such as WAIT."""
    if isinstance(client, RedisCluster):
        return client.get_redis_connection(client.get_node_from_key(key))
    return client


def refresh_slots(client: redis.Redis | RedisCluster) -> None:
    """Re-read the cluster's slot map after a node failed or a slot moved under `node_of`'s
    caller (RedisCluster refreshes it by itself only for commands it sent)."""
    if isinstance(client, RedisCluster):
        client.nodes_manager.initialize()


def make_queue_redis(url: str) -> redis.Redis:
    """Connection for RQ: RQ stores pickled job data, so no response decoding."""
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=10)
