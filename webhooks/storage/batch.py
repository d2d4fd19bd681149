"""Several script calls and plain commands in one round trip, typed:

    with store.batch() as b:
        claim = b.claim_lead(lead, token, ...)     # Pending[LeadClaim]
    claim.value.outcome                            # filled when the block ends

Each method queues its command on a non-transactional pipeline and returns a `Pending` that
holds the reply's place, so no caller counts positions. Scripts go as EVAL (no SCRIPT EXISTS
round trip per pipeline); on a Redis Cluster, to the node of their first key (`_script`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Generic, TypeAlias, TypeVar

import redis
from redis.cluster import ClusterPipeline, RedisCluster

import lua
from webhooks.storage import scripts
from webhooks.storage.scripts import (
    NO_HOLD,
    Answered,
    Arg,
    BreakerRule,
    Call,
    CapCounter,
    Charge,
    Hold,
    LeadClaim,
    LeadKey,
    Lease,
    Reserved,
)
from webhooks.storage.states import AttemptOutcome

T = TypeVar("T")
U = TypeVar("U")
_UNSENT = object()
Client: TypeAlias = "redis.Redis | RedisCluster"  # one Redis, a cluster, or one node of it


class Pending(Generic[T]):
    """The reply of one queued command, read (once) when first asked for after its batch was sent."""

    __slots__ = ("_read", "_value", "_done")

    def __init__(self, read: Callable[[], T]) -> None:
        self._read = read
        self._done = False

    @property
    def value(self) -> T:
        if not self._done:
            self._value, self._done = self._read(), True
        return self._value

    def then(self, fn: Callable[[T], U]) -> Pending[U]:
        """This reply, read further by `fn`."""
        return Pending(lambda: fn(self.value))


class _Slot:
    """Where one command's raw reply lands."""

    __slots__ = ("raw",)

    def __init__(self) -> None:
        self.raw: Any = _UNSENT


def _same(raw: Any) -> Any:
    return raw


class Batch:
    """Commands queued on one pipeline of `client` (a Redis, a cluster, or one node of it),
    sent together.

    Sent together is not run together: redis-py writes a pipeline past 6,000 bytes in several
    writes (a script travels with its source), and Redis runs each command it has read. A
    process killed between two writes leaves the first commands done and the rest never sent.
    `atomic` wraps the batch in MULTI/EXEC: Redis runs none of it unless all of it arrived. On
    one Redis only: a cluster's keys live on several nodes, so there it is sent as it is."""

    def __init__(self, client: redis.Redis | RedisCluster, atomic: bool = False) -> None:
        self._pipe = client.pipeline(transaction=atomic and not isinstance(client, RedisCluster))
        self._slots: list[_Slot] = []

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.execute()

    def execute(self) -> None:
        """Send what is queued (nothing: no round trip) and fill its replies."""
        if not self._slots:
            return
        slots, self._slots = self._slots, []
        for slot, raw in zip(slots, self._pipe.execute(), strict=True):
            slot.raw = raw

    def _add(self, read: Callable[[Any], T]) -> Pending[T]:
        slot = _Slot()
        self._slots.append(slot)

        def value() -> T:
            if slot.raw is _UNSENT:
                raise RuntimeError("the batch holding this command has not been sent")
            return read(slot.raw)

        return Pending(value)

    def _script(self, call: Call[T]) -> Pending[T]:
        # A raw command, as redis-py's cluster pipeline has no `eval` method. There it is
        # sent to the node of its first key: left to find the node itself, that pipeline asks
        # a node which keys the EVAL has (COMMAND GETKEYS, with the whole script) in a round
        # trip of its own. A stale node answers MOVED, which the pipeline follows.
        options = (
            {"target_nodes": self._pipe.get_node_from_key(call.keys[0])}
            if isinstance(self._pipe, ClusterPipeline)
            else {}
        )
        self._pipe.execute_command("EVAL", lua.source(call.name), len(call.keys), *call.keys, *call.args, **options)
        return self._add(call.read)

    # --- the scripts that share round trips ---------------------------------------------------

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
    ) -> Pending[LeadClaim]:
        """See Store.claim_lead."""
        return self._script(
            scripts.claim_lead(
                lead, token, ttl_ms, now_ms, note=note, note_ttl_ms=note_ttl_ms, caps=caps, bucket=bucket
            )
        )

    def answer_lead(self, lead: LeadKey, token: str, answer: str, ttl_s: int) -> Pending[Answered]:
        """See Store.answer_lead."""
        return self._script(scripts.answer_lead(lead, token, answer, ttl_s))

    def restore_answer(self, lead: LeadKey, answer: str, ttl_s: int) -> Pending[bool]:
        """See Store.restore_answers."""
        return self._script(scripts.restore_answer(lead, answer, ttl_s))

    def release_claim(self, key: str, token: str) -> Pending[bool]:
        """See Store.release_claim."""
        return self._script(scripts.release_claim(key, token))

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
    ) -> Pending[Reserved]:
        """See Store.reserve_lease."""
        return self._script(
            scripts.reserve_lease(
                lease,
                charges,
                lease_ttl_ms=lease_ttl_ms,
                probe_ttl_ms=probe_ttl_ms,
                dedupe_ms=dedupe_ms,
                note_key=note_key,
                hold=hold,
            )
        )

    def finish_lease(
        self,
        lease: Lease,
        outcome: AttemptOutcome | str,
        breaker: BreakerRule,
        confirmed_ttl_ms: int,
        *,
        replied: bool = True,
    ) -> Pending[bool]:
        """See Store.finish_lease."""
        return self._script(scripts.finish_lease(lease, outcome, breaker, confirmed_ttl_ms, replied=replied))

    # --- plain commands -------------------------------------------------------------------------

    def get(self, key: str) -> Pending[str | None]:
        self._pipe.get(key)
        return self._add(_same)

    def set(self, key: str, value: Arg, *, px: int | None = None, nx: bool = False) -> Pending[bool | None]:
        self._pipe.set(key, value, px=px, nx=nx)
        return self._add(_same)

    def delete(self, *names: str) -> Pending[int]:
        self._pipe.delete(*names)
        return self._add(int)

    def decr(self, key: str) -> Pending[int]:
        self._pipe.decr(key)
        return self._add(int)

    def exists(self, *names: str) -> Pending[int]:
        self._pipe.exists(*names)
        return self._add(int)

    def hget(self, key: str, field: str) -> Pending[str | None]:
        self._pipe.hget(key, field)
        return self._add(_same)

    def hmget(self, key: str, fields: Sequence[str]) -> Pending[list[str | None]]:
        self._pipe.hmget(key, list(fields))
        return self._add(list)

    def lpush(self, key: str, *values: str) -> Pending[int]:
        self._pipe.lpush(key, *values)
        return self._add(int)

    def wait(self, replicas: int, timeout_ms: int) -> Pending[int]:
        """WAIT: how many replicas hold every write sent before it on this connection."""
        self._pipe.execute_command("WAIT", replicas, timeout_ms)
        return self._add(int)
