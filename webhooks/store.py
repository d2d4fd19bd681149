"""Redis clients: bounded, blocking connection pools (gevent-safe), short timeouts so an
unreachable Redis becomes a fast 503 rather than a hung request."""
from __future__ import annotations

import redis

from lua import Scripts

# redis-py errors that mean "Redis is not answering": the caller answers 503.
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def make_redis(url: str, max_connections: int = 64) -> redis.Redis:
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=5,  # wait for a free connection at most this long
        socket_timeout=2,
        socket_connect_timeout=1,
        health_check_interval=30,
        decode_responses=True,
    )
    client = redis.Redis(connection_pool=pool)
    client.scripts = Scripts(client)  # registered once per client, see lua/__init__.py
    return client


def make_queue_redis(url: str) -> redis.Redis:
    """Connection for RQ: RQ stores pickled job data, so no response decoding."""
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=10)
