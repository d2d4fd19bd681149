"""Floodgate's Lua scripts, one per file, registered once per Redis client.

redis-py's Script object calls EVALSHA and falls back to EVAL by itself after a Redis
restart has emptied the script cache (the way alisaifee/limits loads its scripts).
"""
from __future__ import annotations

from importlib import resources

from redis.cluster import ClusterPipeline


def source(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.lua").read_text()


class Scripts:
    """Attribute access to every script of this folder, registered on `client`."""

    def __init__(self, client):
        self._sources = {}
        for entry in resources.files(__package__).iterdir():
            if entry.name.endswith(".lua"):
                name = entry.name[: -len(".lua")]
                self._sources[name] = entry.read_text()
                setattr(self, name, client.register_script(self._sources[name]))

    def queue(self, pipe, name: str, keys: list, args: list) -> None:
        """Add a script call to a pipeline. EVAL, not EVALSHA: redis-py would otherwise check
        SCRIPT EXISTS in an extra round trip on every pipeline (Redis caches the script).
        A raw command, as redis-py's cluster pipeline has no `eval` method. There it is sent
        to the node of its first key: left to find the node itself, that pipeline asks a node
        which keys the EVAL has (COMMAND GETKEYS, with the whole script) in a round trip of
        its own. A stale node answers MOVED, which the pipeline follows."""
        options = {"target_nodes": pipe.get_node_from_key(keys[0])} if isinstance(pipe, ClusterPipeline) else {}
        pipe.execute_command("EVAL", self._sources[name], len(keys), *keys, *args, **options)
