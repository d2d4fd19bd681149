"""Redis clients: bounded, blocking connection pools (gevent-safe), short timeouts so an
unreachable Redis becomes a fast 503 rather than a hung request.

A `redis+cluster://host:port` (or `rediss+cluster://`) URL names a Redis Cluster through any
one of its nodes: the client is then redis-py's RedisCluster, which discovers the others and
keeps one bounded pool per node. Every Lua script touches the keys of one hash slot, and
non-transactional pipelines may mix slots (redis-py splits them per node), so the rest of
the code does not care which kind of client it holds.
"""

from __future__ import annotations

import select
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import redis
from gevent import monkey
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import (
    ClusterError,
    NoScriptError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.maint_notifications import MaintNotificationsConfig
from redis.typing import PatternT

import lua
from webhooks.storage.live import keys, scripts, settle_queue
from webhooks.storage.live.batch import Batch, send_pooled
from webhooks.storage.live.scripts import (
    NO_HOLD,
    Answered,
    Backlog,
    Balance,
    BalanceReconciled,
    BreakerRule,
    Call,
    CapCounter,
    CapSnapshot,
    Charge,
    Claimed,
    Extended,
    GateReply,
    Hold,
    LeadClaim,
    LeadKey,
    Lease,
    LedgerBalance,
    PaymentRef,
    Reserved,
    WalletLeases,
)
from webhooks.storage.states import AttemptOutcome

T = TypeVar("T")

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# redis-py errors that mean "Redis is not answering": the caller answers 503. The cluster ones
# are a failover in progress (CLUSTERDOWN, TRYAGAIN, a slot without a node, retries used up).
REDIS_DOWN = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,
    ClusterError,
    TryAgainError,
    SlotNotCoveredError,
)


class ClusterUnreachable(redis.ConnectionError):
    """No node of the cluster answers (redis-py says so with a RedisClusterException, the
    class it also uses for programming errors such as keys of several slots in one script)."""


def _unreachable(exc: RedisClusterException) -> bool:
    return isinstance(exc.__cause__, (redis.ConnectionError, redis.TimeoutError))


class Cluster(RedisCluster):
    """redis-py's RedisCluster, with an unreachable cluster reported as a ConnectionError (a
    503, like an unreachable single Redis, while a CROSSSLOT bug stays a 500), and `ping` and
    `keys` covering every slot (as on one Redis) rather than one or every node."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except RedisClusterException as exc:
            if _unreachable(exc):
                raise ClusterUnreachable(str(exc)) from exc
            raise

    def ping(self, **kwargs: Any) -> bool:
        """PING every primary. redis-py pings every node, replicas too: a replica down would
        then make each web process unready although every lead can still be routed."""
        return super().ping(target_nodes=self.PRIMARIES, **kwargs)

    def keys(self, pattern: PatternT = "*", **kwargs: Any) -> list[bytes | str]:
        """KEYS of every primary, as on one Redis (redis-py asks one node only)."""
        return super().keys(pattern, target_nodes=self.PRIMARIES, **kwargs)


@dataclass(frozen=True)
class ReplicaWait:
    """How many replicas must hold a cap reservation before its lead is delivered, and how
    long to wait for them (CAP_WAIT_REPLICAS, CAP_WAIT_TIMEOUT_MS). 0 replicas: no waiting."""

    replicas: int = 0
    timeout_ms: int = 100


class RateDecision(NamedTuple):
    """A publisher's token bucket's answer: `allowed` with `tokens` whole tokens left, else
    `wait_ms` until its next token."""

    allowed: bool
    wait_ms: int
    tokens: int = 0


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0] in CLUSTER_SCHEMES


_SYSTEM_POLL = monkey.get_original("select", "poll")  # poll(2) itself, not gevent's greenlet version


class Connection(redis.Connection):
    """redis-py's TCP connection, with the check its pool makes at every checkout (a reply left
    unread, or a socket the server closed) made with one poll(2) call when nothing is buffered.
    redis-py makes it with `select.poll`, which gevent's monkey-patching turns into a round
    through the event loop: 4.5 % of a web worker's CPU on the payment path (bench/profile).

    redis-py 8 skips acting on the check while maintenance notifications are on ("auto", its
    default), though it still makes it: make_redis turns them off (they are Redis Enterprise's
    and cluster-only), so a connection with a reply left unread is opened again, not reused."""

    def can_read(self, timeout: float = 0) -> bool:
        reader = getattr(self._parser, "_reader", None)  # hiredis's: the bytes it holds unparsed
        if timeout == 0 and self._sock is not None and reader is not None and not reader.has_data():
            poller = _SYSTEM_POLL()
            poller.register(self._sock, select.POLLIN)
            if not poller.poll(0):
                return False  # nothing to read and not closed (a closed socket polls readable)
        return bool(super().can_read(timeout))


# How make_redis and make_queue_redis connect to a single Redis (a rediss:// or unix:// URL
# sets its own connection class): Connection's check, acted on.
_SINGLE_NODE = {"connection_class": Connection, "maint_notifications_config": MaintNotificationsConfig(enabled=False)}


def make_redis(url: str, max_connections: int = 64) -> redis.Redis | RedisCluster:
    """A client of `url`: bounded, blocking pools, short timeouts. For a cluster,
    `max_connections` bounds each node's pool."""
    options = {
        "max_connections": max_connections,
        "timeout": 5,
        "socket_timeout": 2,
        "socket_connect_timeout": 1,
        "decode_responses": True,
    }
    scheme, rest = url.split("://", 1)
    if scheme in CLUSTER_SCHEMES:
        # `timeout` is the BlockingConnectionPool's wait for a free connection (per node).
        try:
            return Cluster.from_url(
                f"{CLUSTER_SCHEMES[scheme]}://{rest}", connection_pool_class=redis.BlockingConnectionPool, **options
            )
        except RedisClusterException as exc:
            if _unreachable(exc):
                raise ClusterUnreachable(str(exc)) from exc
            raise
    pool = redis.BlockingConnectionPool.from_url(url, health_check_interval=30, **_SINGLE_NODE, **options)
    return redis.Redis(connection_pool=pool)


def _send(client: redis.Redis, command: tuple[Any, ...]) -> Any:
    """One command on a connection of the client's pool (batch.send_pooled), and its reply as
    the server sent it (a script's: redis-py has no callback for EVALSHA's), as
    `client.execute_command` runs it, without the rest of redis-py 8's path: its checks of the
    arguments, its observability hooks and its retry wrapper (bench/REPORT.md part 40). A
    connection cut off mid-command (an error, a request's deadline) is closed, so none goes
    back to the pool with a reply unread. A client whose connections retry (redis.Redis's own
    pool; make_redis's never do) sends it through redis-py's path, retries and all."""
    replies = send_pooled(client, [command])
    if replies is None:
        return client.execute_command(*command)  # type: ignore[no-untyped-call]
    if isinstance(replies[0], ResponseError):
        raise replies[0]
    return replies[0]


class Store:
    """A Redis client (one server or a cluster) with Floodgate's Lua scripts registered on it
    once (the way alisaifee/limits' RedisStorage keeps its scripts), each reached through one
    typed method below that builds its KEYS from keys.py and returns a named result
    (storage/live/scripts.py); `batch()` queues several in one round trip. `redis` takes every
    plain command; `cap_wait` is how many replicas must hold a cap reservation before its
    lead is delivered."""

    def __init__(self, client: redis.Redis | RedisCluster, cap_wait: ReplicaWait = ReplicaWait()):
        self.redis = client
        self.cap_wait = cap_wait
        # a wallet's buyers draw on one balance hash; on a cluster a wallet is one buyer's alone
        # and its balance sits in that buyer's slot (docs/cluster.md "Wallets")
        self.shared_wallets = not isinstance(client, RedisCluster)
        self.scripts: dict[str, Script] = {name: client.register_script(lua.source(name)) for name in scripts.NAMES}

    def batch(self, on_node_of: str | None = None, atomic: bool = False) -> Batch:
        """Commands sent together (storage/live/batch.py); with `on_node_of`, on a plain client of
        that key's node (the store's client itself unless a cluster): for WAIT, which counts
        the replicas holding the writes of its own connection. `atomic`: all or none of them
        run (Batch's MULTI/EXEC, on one Redis)."""
        client = self.redis if on_node_of is None else node_of(self.redis, on_node_of)
        return Batch(client, atomic, shared_wallets=self.shared_wallets)

    def _run(self, call: Call[T]) -> T:
        """EVALSHA the call's script; a Redis that does not know it (restarted, failed over,
        flushed) gets it from redis-py's Script, which loads it and runs it again. Sent as a
        command of its own: Script's call re-imports Pipeline and checks the client against it
        on every call (about 14 µs of a web worker's CPU)."""
        script = self.scripts[call.name]
        command = ("EVALSHA", script.sha, len(call.keys), *call.keys, *call.args)
        try:
            if isinstance(self.redis, RedisCluster):
                raw = self.redis.execute_command(*command)
            else:
                raw = _send(self.redis, command)
        except NoScriptError:
            raw = script(keys=list(call.keys), args=list(call.args))
        return call.read(raw)

    def take_token(self, publisher_id: str, per_second: int, burst: int) -> RateDecision:
        """One token of the publisher's bucket (lua/take_token.lua), in one round trip."""
        taken, value = self._run(scripts.take_token(publisher_id, per_second, burst))
        return RateDecision(True, 0, value) if taken else RateDecision(False, value)

    # --- lead claims (lua/claim_lead.lua, answer_lead, restore_answer, claim_or_get, release_claim)

    def claim_lead(
        self,
        lead: LeadKey,
        token: str,
        *,
        ttl_ms: int,
        now_ms: int,
        note: str = "",
        note_ttl_ms: int = 0,
        caps: Sequence[CapCounter] = (),
        bucket: tuple[int, int] | None = None,
    ) -> LeadClaim:
        """Claim `lead` for `token` for `ttl_ms` and, when the claim is ours and no dead
        request left a note, write this request's attempt `note`; read the publisher's replay
        memory mark (set anew at `now_ms` when Redis lost it). A lead claimed afresh counts in
        each of the publisher's `caps`, or is not claimed (CAPPED) when one is full. With a
        `bucket` ((per_second, burst)) the lead's token is taken first: none left, nothing
        else is done (THROTTLED)."""
        return self._run(
            scripts.claim_lead(
                lead, token, ttl_ms, now_ms, note=note, note_ttl_ms=note_ttl_ms, caps=caps, bucket=bucket
            )
        )

    def answer_lead(self, lead: LeadKey, token: str, answer: str, ttl_s: int) -> Answered:
        """Remember the lead's answer for replays and forget its attempt note, unless another
        request holds the claim now."""
        return self._run(scripts.answer_lead(lead, token, answer, ttl_s))

    def restore_answers(self, answers: Sequence[tuple[LeadKey, str]], ttl_s: int) -> int:
        """Put back the answers of the leads `answers` [(lead, answer JSON)] whose claims hold
        none (after Redis lost them), in one round trip; how many."""
        with self.batch() as b:
            done = [b.restore_answer(lead, answer, ttl_s) for lead, answer in answers]
        return sum(1 for d in done if d.value)

    def claim_or_get(self, key: str, token: str, ttl_ms: int) -> Claimed:
        """SET `key` to `token` NX PX `ttl_ms`, else say who holds it."""
        return self._run(scripts.claim_or_get(key, token, ttl_ms))

    def release_claim(self, key: str, token: str) -> bool:
        """Delete the claim `key` only if it still holds `token`."""
        return self._run(scripts.release_claim(key, token))

    # --- cap leases (lua/reserve_lease.lua, extend_lease, finish_lease) -------------------------

    def reserve_lease(
        self,
        lease: Lease,
        charges: Sequence[Charge],
        *,
        lease_ttl_ms: int,
        probe_ttl_ms: int,
        dedupe_ms: int,
        note_key: str,
        hold: Hold = NO_HOLD,
    ) -> Reserved:
        """Open `lease`: add `charges` to its counters (one per counter, in order), all or
        nothing, and set its dedupe keys, gated on the buyer's ready key, dedupe keys and
        circuits (its own and the one for the lease's publisher)."""
        return self._run(
            scripts.reserve_lease(
                lease,
                charges,
                lease_ttl_ms=lease_ttl_ms,
                probe_ttl_ms=probe_ttl_ms,
                dedupe_ms=dedupe_ms,
                note_key=note_key,
                hold=hold,
                shared=self.shared_wallets,
            )
        )

    def balance_key(self, buyer_id: str, wallet: str) -> str:
        """The balance the buyer, billed from `wallet` ("<account>|<currency>"), draws on."""
        return keys.balance_of(buyer_id, wallet, shared=self.shared_wallets)

    def extend_lease(self, lease: Lease, ttl_ms: int) -> Extended:
        """Give a held lease `ttl_ms` more; say its state."""
        return self._run(scripts.extend_lease(lease, ttl_ms))

    def finish_lease(
        self,
        lease: Lease,
        outcome: AttemptOutcome | str,
        breaker: BreakerRule,
        confirmed_ttl_ms: int,
        *,
        replied: bool = True,
    ) -> bool:
        """Confirm (accepted) or refund the lease, feeding the buyer's circuits (`replied`: see
        scripts.finish_lease); whether it changed state."""
        return self._run(scripts.finish_lease(lease, outcome, breaker, confirmed_ttl_ms, replied=replied))

    # --- counters (lua/give_back.lua, rebuild_counters, snapshot_caps, adjust_counter) ----------

    def give_back(self, buyer_id: str, amounts: Sequence[tuple[str, int]]) -> bool:
        """Give a returned lead's `amounts` [(counter, amount)] back, unless the buyer is being
        reconciled (False: the reconciliation counts the return)."""
        return self._run(scripts.give_back(buyer_id, amounts))

    def rebuild_counters(
        self, buyer_id: str, token: str, values: Sequence[tuple[str, int, int]], balance: LedgerBalance | None = None
    ) -> bool:
        """Raise the buyer's counters to `values` [(counter, value, expire-at)], set a billed
        buyer's balance from the ledger, and mark them trusted, if `token` still holds the
        rebuild lock."""
        key = "" if balance is None else self.balance_key(buyer_id, balance.account)
        return self._run(scripts.rebuild_counters(buyer_id, token, values, balance, key))

    def sync_balance(
        self, buyer_id: str, wallet: LedgerBalance, settled_leases: Sequence[str] = (), *, init: bool = False
    ) -> Balance | None:
        """Take the ledger's wallet figure if newer, and give back what the buyer's settled
        leases held (lua/sync_balance.lua)."""
        leases = [keys.lease(buyer_id, lease_id) for lease_id in settled_leases]
        return self._run(scripts.sync_balance(self.balance_key(buyer_id, wallet.account), wallet, leases, init=init))

    def reconcile_balance(self, found: WalletLeases) -> BalanceReconciled:
        """Set a wallet's balance to the ledger's and what its buyers' leases and queued sales
        hold (lua/reconcile_balance.lua)."""
        return self._run(scripts.reconcile_balance(found))

    def snapshot_caps(self, buyer_id: str, counters: Sequence[str], lease_ids: Sequence[str]) -> CapSnapshot:
        """The counters and every live lease at one instant (CHANGED when `lease_ids` are not
        the leases the buyer holds)."""
        return self._run(scripts.snapshot_caps(buyer_id, counters, lease_ids))

    def adjust_counter(self, counter: str, delta: int, expire_at: int) -> int:
        """Add `delta` to the counter, never below zero; its new value."""
        return self._run(scripts.adjust_counter(counter, delta, expire_at))

    # --- write-behind lists and payments (lua/take_batch.lua, payment_gate, finish_payment) -----

    def take_batch(self, backlog: Backlog, job_id: str, size: int) -> list[str]:
        """The job's batch of `backlog`: the one it took before it was killed, topped up to `size`."""
        return self._run(scripts.take_batch(backlog, job_id, size))

    def payment_gate(
        self,
        ref: PaymentRef,
        fingerprint: str,
        token: str,
        claim_ttl_ms: int,
        *,
        body_sha256: str,
        audited_ttl_ms: int,
        audit_row: str | None = None,
    ) -> GateReply:
        """A payment webhook's duplicate check and claim in one step (see scripts.payment_gate)."""
        return self._run(
            scripts.payment_gate(
                ref,
                fingerprint,
                token,
                claim_ttl_ms,
                body_sha256=body_sha256,
                audit_row=audit_row,
                scheduled_ttl_ms=settle_queue.SCHEDULED_TTL_MS,
                audited_ttl_ms=audited_ttl_ms,
            )
        )

    def finish_payment(self, ref: PaymentRef, token: str, fingerprint: str | None, marker_ttl_s: int) -> None:
        """Set the processed marker to `fingerprint` (None: leave it) and release the claim."""
        self._run(scripts.finish_payment(ref, token, fingerprint, marker_ttl_s))


def make_store(url: str, max_connections: int = 64, wait_replicas: int = 0, wait_timeout_ms: int = 100) -> Store:
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
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=10, **_SINGLE_NODE)
