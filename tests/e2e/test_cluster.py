"""Redis Cluster specifics against a cluster of this module's own (3 primaries + 3 replicas):
configuration, and the replica wait that keeps cap reservations through a failover. The lead,
payment, cap and reconciliation suites run whole against a cluster too (FG_TEST_REDIS_CLUSTER=1,
see conftest.py and .ci/run)."""

from __future__ import annotations

import signal
import threading
from datetime import datetime, timezone

import pytest
import redis

from testkit.cluster import LocalCluster, wait_for_failover
from testkit.servers import wait_until
from tests.caps.test_leases import BREAKER, TTL, rule
from webhooks import config
from webhooks.caps import leases
from webhooks.errors import ConfigError
from webhooks.storage.live import keys, persistence
from webhooks.storage.live.redis import make_redis, make_store

WAIT = {"wait_replicas": 1, "wait_timeout_ms": 100}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = LocalCluster(tmp_path_factory.mktemp("own-cluster"), node_timeout_ms=1000)
    server.start()
    yield server
    server.kill()


def day_counter(b) -> str:
    """The buyer's daily cap counter of this moment."""
    return leases.counter_key(b.id, leases.windows(b, datetime.now(timezone.utc))[0][2])


def test_a_cluster_redis_url_needs_a_single_redis_for_rq():
    with pytest.raises(ConfigError, match="RQ cannot use"):
        config.load({"REDIS_URL": "redis+cluster://10.0.0.1:7000"})
    with pytest.raises(ConfigError, match="RQ cannot use"):
        config.load({"REDIS_URL": "redis://10.0.0.1:7000", "REDIS_CLUSTER": "1"})
    with pytest.raises(ConfigError, match="RQ_REDIS_URL must name a single Redis"):
        config.load({"RQ_REDIS_URL": "redis+cluster://10.0.0.1:7000"})
    cfg = config.load(
        {
            "REDIS_URL": "rediss://10.0.0.1:7000",
            "REDIS_CLUSTER": "1",
            "RQ_REDIS_URL": "redis://10.0.0.2:6379/0",
            "CAP_WAIT_REPLICAS": "1",
        }
    )
    assert (cfg.redis_url, cfg.queue_redis_url) == ("rediss+cluster://10.0.0.1:7000", "redis://10.0.0.2:6379/0")
    assert (cfg.cap_wait_replicas, cfg.cap_wait_timeout_ms) == (1, 100)
    with pytest.raises(ConfigError, match="CAP_WAIT_REPLICAS"):
        config.load({"CAP_WAIT_REPLICAS": "-1"})


def test_an_erasure_rewrites_the_aof_of_every_node_primaries_and_replicas(cluster):
    # before the failovers below: every node lives
    nodes = {port: redis.Redis(port=port, decode_responses=True) for port in cluster.live_ports()}
    for node in nodes.values():
        node.config_set("appendonly", "yes")  # starts a rewrite that makes the AOF
    wait_until(
        lambda: all(n.info("persistence")["aof_rewrite_in_progress"] == 0 for n in nodes.values()),
        what="every node's first AOF",
    )
    secret = "erase.me.cluster@example.com"
    client = make_redis(cluster.url)
    try:
        client.rpush("fg:{erasure}:list", secret, "other")
        client.lpop("fg:{erasure}:list")
        primary = cluster.primary_of("fg:{erasure}:list")
        holders = {primary, cluster.replica_of(primary)}

        def holding() -> set[int]:
            return {
                port
                for port in nodes
                if any(secret.encode() in f.read_bytes() for f in (cluster.dir / str(port)).rglob("*.aof"))
            }

        wait_until(lambda: holding() == holders, what="the primary's and its replica's AOF to hold the value")
        before = {port: n.info("persistence")["aof_rewrites"] for port, n in nodes.items()}
        done = persistence.rewrite([client], wait_s=60)
        assert done.files is persistence.Files.REWRITTEN, done
        assert holding() == set()
        assert all(n.info("persistence")["aof_rewrites"] > before[port] for port, n in nodes.items())
    finally:
        client.close()
        for node in nodes.values():
            node.config_set("appendonly", "no")
            node.close()


def test_reservations_acknowledged_by_a_replica_survive_the_failover_of_their_primary(cluster):
    """Reservations go on from 20 threads while the buyer's primary is cut off from its replica
    (frozen, its link closed) and then killed: the way Redis Cluster loses acknowledged writes.
    Every reservation answered "ok" is still counted by the promoted replica."""
    b = rule("failover", daily=100_000)
    counter = day_counter(b)
    leases.mark_ready(make_redis(cluster.url), b.id)
    primary = cluster.primary_of(counter)
    replica = cluster.procs[cluster.replica_of(primary)]
    ok, stop, lock = [], threading.Event(), threading.Lock()

    def reserve() -> None:
        mine = make_store(cluster.url, **WAIT)
        while not stop.is_set():
            try:
                status = leases.reserve(mine, b, datetime.now(timezone.utc), **TTL).status
            except redis.RedisError:
                continue  # not acknowledged, or the failover: no reservation was granted
            with lock:
                ok.append(status)

    threads = [threading.Thread(target=reserve) for _ in range(20)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(ok) >= 100, what="reservations under way")
        replica.send_signal(signal.SIGSTOP)
        redis.Redis(port=primary).client_kill_filter(_type="replica")
        stop.wait(0.3)  # the primary alone: nothing it does now reaches its replica
        cluster.kill_node(primary)
        replica.send_signal(signal.SIGCONT)
        wait_for_failover(cluster, primary)
    finally:
        replica.send_signal(signal.SIGCONT)
        stop.set()
        for t in threads:
            t.join(30)
    cluster.start_node(primary)  # back, as a replica of the promoted node
    cluster.wait_ok()
    assert set(ok) == {"ok"}
    r = make_redis(cluster.url)
    # the day's counter, and the next day's too when a day began while it ran
    assert sum(int(r.get(c) or 0) for c in {counter, day_counter(b)}) >= len(ok)


def test_a_reservation_no_replica_acknowledges_in_time_is_withdrawn_and_refused(cluster):
    b = rule("unacked", daily=10)
    counter = day_counter(b)
    store = make_store(cluster.url, wait_replicas=1, wait_timeout_ms=100)
    r = store.redis
    leases.mark_ready(r, b.id)
    replica = cluster.procs[cluster.replica_of(cluster.primary_of(counter))]
    replica.send_signal(signal.SIGSTOP)  # alive, but acknowledges nothing
    try:
        with pytest.raises(redis.TimeoutError, match="0 of 1 replica"):
            leases.reserve(store, b, datetime.now(timezone.utc), **TTL)
    finally:
        replica.send_signal(signal.SIGCONT)
    # withdrawn: the slot is free again (the next day's counter when a day began meanwhile)
    values = [r.get(c) for c in (counter, day_counter(b))]
    assert "0" in values and set(values) <= {"0", None}
    assert r.zcard(keys.leases(b.id)) == 0 and r.exists(keys.breaker(b.id)) == 0

    def acknowledged() -> bool:  # the resumed replica catches up first (longer on a loaded machine)
        try:
            return leases.reserve(store, b, datetime.now(timezone.utc), **TTL).status == "ok"
        except redis.TimeoutError:
            return False

    wait_until(acknowledged, timeout=20, what="the resumed replica to acknowledge reservations again")


def test_withdrawing_a_probe_leaves_the_breaker_as_it_was(cluster):
    """A withdrawn lease called no buyer: it neither counts as a failure nor closes the circuit."""
    b = rule("probing")
    store = make_store(cluster.url)
    r = store.redis
    leases.mark_ready(r, b.id)
    for _ in range(3):
        leases.finish(store, leases.reserve(store, b, datetime.now(timezone.utc), **TTL).lease, "timeout", **BREAKER)
    opened = r.hgetall(keys.breaker(b.id))
    threading.Event().wait(0.5)  # past the cool-down (400 ms): the next reservation is the probe
    probe = leases.reserve(store, b, datetime.now(timezone.utc), **TTL).lease
    assert probe.probe
    leases.finish(store, probe, leases.WITHDRAWN, **BREAKER)
    after = r.hgetall(keys.breaker(b.id))
    assert after["failures"] == "3" and after["open_until"] == opened["open_until"]
