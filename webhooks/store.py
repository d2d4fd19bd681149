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

import redis
from redis.cluster import NodesManager, RedisCluster
from redis.exceptions import ClusterError, RedisClusterException, SlotNotCoveredError, TryAgainError

from lua import Scripts

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# redis-py errors that mean "Redis is not answering": the caller answers 503. The cluster ones
# are a failover in progress (CLUSTERDOWN, TRYAGAIN, a slot without a node, retries used up).
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ClusterError,
              TryAgainError, SlotNotCoveredError)


class ClusterUnreachable(redis.ConnectionError):
    """No node of the cluster answers (redis-py says so with a RedisClusterException, the
    class it also uses for programming errors such as keys of several slots in one script)."""


class _NodesManager(NodesManager):
    """redis-py's slot map keeper, reporting an unreachable cluster as a ConnectionError, so
    that it is a 503 like an unreachable single Redis while a CROSSSLOT bug stays a 500."""

    def initialize(self, *args, **kwargs):
        try:
            return super().initialize(*args, **kwargs)
        except RedisClusterException as exc:
            if isinstance(exc.__cause__, (redis.ConnectionError, redis.TimeoutError)):
                raise ClusterUnreachable(str(exc)) from exc
            raise


class Cluster(RedisCluster):
    """redis-py's RedisCluster, with an unreachable cluster reported as a ConnectionError, and
    `ping` and `keys` covering every slot (as on one Redis) rather than one or every node."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.nodes_manager.__class__ = _NodesManager  # redis-py takes no NodesManager class

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


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0] in CLUSTER_SCHEMES


def make_redis(url: str, max_connections: int = 64, wait_replicas: int = 0,
               wait_timeout_ms: int = 100) -> redis.Redis | RedisCluster:
    """A client of `url` with the project's scripts registered (`client.scripts`) and the
    cap reservations' replica wait (`client.cap_wait`). For a cluster, `max_connections`
    bounds each node's pool."""
    options = {"max_connections": max_connections, "timeout": 5, "socket_timeout": 2,
               "socket_connect_timeout": 1, "decode_responses": True}
    scheme, rest = url.split("://", 1)
    if scheme in CLUSTER_SCHEMES:
        # `timeout` is the BlockingConnectionPool's wait for a free connection (per node).
        client = Cluster.from_url(f"{CLUSTER_SCHEMES[scheme]}://{rest}",
                                  connection_pool_class=redis.BlockingConnectionPool, **options)
    else:
        pool = redis.BlockingConnectionPool.from_url(url, health_check_interval=30, **options)
        client = redis.Redis(connection_pool=pool)
    client.scripts = Scripts(client)  # registered once per client, see lua/__init__.py
    client.cap_wait = ReplicaWait(wait_replicas, wait_timeout_ms)
    return client


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
