"""Several script calls and plain commands in one round trip, typed:

    with store.batch() as b:
        claim = b.claim_lead(lead, token, ...)     # Pending[LeadClaim]
    claim.value.outcome                            # filled when the block ends

Each method queues its command and returns a `Pending` that holds the reply's place, so no
caller counts positions. Scripts go as EVAL (no SCRIPT EXISTS round trip per batch); on a
Redis Cluster, to the node of their first key (`_script`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Generic, TypeAlias, TypeVar

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ExecAbortError, ResponseError

import lua
from webhooks.storage.live import scripts
from webhooks.storage.live.scripts import (
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
    Prechecked,
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
    """Commands queued for one round trip to `client` (a Redis, a cluster, or one node of it),
    sent together.

    Sent together is not run together: a batch past a few KB (a script travels with its
    source) goes in several writes, and Redis runs each command it has read. A process killed
    between two writes leaves the first commands done and the rest never sent. `atomic` wraps
    the batch in MULTI/EXEC: Redis runs none of it unless all of it arrived. On one Redis
    only: a cluster's keys live on several nodes, so there it is sent as it is.

    On one Redis the batch is written and read on a connection of the client's pool itself
    (`_send_on`), not through redis-py's Pipeline: what that adds per round trip (its
    argument checks, observability hooks, HIMPORT bookkeeping, retry wrapper) cost about 6 %
    of a web worker's CPU per lead (bench/REPORT.md part 41). A cluster, and a client whose
    connections retry, keep redis-py's pipeline."""

    def __init__(self, client: Client, atomic: bool = False, *, shared_wallets: bool = True) -> None:
        self._client = client
        self._shared_wallets = shared_wallets  # see Store.shared_wallets
        self._atomic = atomic and not isinstance(client, RedisCluster)
        self._commands: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self._slots: list[_Slot] = []

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.execute()

    def execute(self) -> None:
        """Send what is queued (nothing: no round trip) and fill its replies. An error reply
        to any command is raised once every reply has been read (redis-py's pipeline does the
        same), annotated with the command's place and name, never its arguments."""
        if not self._slots:
            return
        slots, self._slots = self._slots, []
        commands, self._commands = self._commands, []
        replies = self._replies(commands)
        for number, ((args, _), raw) in enumerate(zip(commands, replies, strict=True), start=1):
            if isinstance(raw, ResponseError):
                raw.args = (f"command #{number} ({args[0]}) of a batch: {raw.args[0] if raw.args else ''}",)
                raise raw
        for slot, raw in zip(slots, replies, strict=True):
            slot.raw = raw

    def _replies(self, commands: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
        client = self._client
        if not isinstance(client, RedisCluster):
            replies = send_pooled(client, [args for args, _ in commands], self._atomic)
            if replies is not None:
                return replies
        pipe = client.pipeline(transaction=self._atomic)
        for args, options in commands:
            pipe.execute_command(*args, **options)
        return list(pipe.execute(raise_on_error=False))

    def _add(self, read: Callable[[Any], T], *args: Any, **options: Any) -> Pending[T]:
        self._commands.append((args, options))
        slot = _Slot()
        self._slots.append(slot)

        def value() -> T:
            if slot.raw is _UNSENT:
                raise RuntimeError("the batch holding this command has not been sent")
            return read(slot.raw)

        return Pending(value)

    def _script(self, call: Call[T]) -> Pending[T]:
        # On a cluster, sent to the node of its first key: left to find the node itself,
        # redis-py's cluster pipeline asks a node which keys the EVAL has (COMMAND GETKEYS,
        # with the whole script) in a round trip of its own. A stale node answers MOVED, which
        # the pipeline follows.
        options = (
            {"target_nodes": self._client.get_node_from_key(call.keys[0])}
            if isinstance(self._client, RedisCluster)
            else {}
        )
        return self._add(call.read, "EVAL", lua.source(call.name), len(call.keys), *call.keys, *call.args, **options)

    # --- the scripts that share round trips ---------------------------------------------------

    def take_precheck(
        self, posted: Sequence[str], prechecks: Sequence[str], *, per_lead: int, daily_floor: int, ttl_s: int
    ) -> Pending[Prechecked]:
        """One pre-ping of a publisher's quota (lua/take_precheck.lua), read and taken at once."""
        return self._script(
            scripts.take_precheck(posted, prechecks, per_lead=per_lead, daily_floor=daily_floor, ttl_s=ttl_s)
        )

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
                shared=self._shared_wallets,
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
        return self._add(_same, "GET", key)

    def set(self, key: str, value: Arg, *, px: int | None = None, nx: bool = False) -> Pending[bool | None]:
        """SET; its value True when set, None when NX found the key (as redis-py's `set`)."""
        args: tuple[Any, ...] = ("SET", key, value)
        if px is not None:
            args += ("PX", px)
        if nx:
            args += ("NX",)
        return self._add(_ok, *args)

    def delete(self, *names: str) -> Pending[int]:
        return self._add(int, "DEL", *names)

    def decr(self, key: str) -> Pending[int]:
        return self._add(int, "DECRBY", key, 1)

    def exists(self, *names: str) -> Pending[int]:
        return self._add(int, "EXISTS", *names)

    def hget(self, key: str, field: str) -> Pending[str | None]:
        return self._add(_same, "HGET", key, field)

    def hmget(self, key: str, fields: Sequence[str]) -> Pending[list[str | None]]:
        return self._add(list, "HMGET", key, *fields)

    def hgetall(self, key: str) -> Pending[dict[str, str]]:
        return self._add(_pairs, "HGETALL", key)

    def lpush(self, key: str, *values: str) -> Pending[int]:
        return self._add(int, "LPUSH", key, *values)

    def wait(self, replicas: int, timeout_ms: int) -> Pending[int]:
        """WAIT: how many replicas hold every write sent before it on this connection."""
        return self._add(int, "WAIT", replicas, timeout_ms)


def _ok(raw: Any) -> bool | None:
    # A SET's reply: "OK" as Redis sends it, True through redis-py's pipeline; nil when NX found the key
    return True if raw is True or raw == "OK" or raw == b"OK" else None


def send_pooled(client: redis.Redis, commands: list[tuple[Any, ...]], atomic: bool = False) -> list[Any] | None:
    """`commands` on a connection of the client's pool (`_send_on`), not through redis-py's
    command path (bench/REPORT.md parts 40 and 41); None, and nothing sent, when the client's
    connections retry (make_redis's never do): such a client keeps redis-py's own path."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        return None if conn.retry.get_retries() else _send_on(conn, commands, atomic)
    finally:
        pool.release(conn)


def _send_on(conn: redis.Connection, commands: list[tuple[Any, ...]], atomic: bool) -> list[Any]:
    """Write `commands` on `conn` at once (in MULTI/EXEC when `atomic`) and read every reply:
    an error reply is returned in its command's place (a ResponseError), as redis-py's
    pipeline collects them. Anything else that cuts the exchange off (a lost connection, a
    request's deadline) closes the connection, so no reply is left on it for the next caller."""
    try:
        if not atomic:
            conn.send_packed_command(conn.pack_commands(commands))  # type: ignore[no-untyped-call]
            return [_read(conn) for _ in commands]
        conn.send_packed_command(conn.pack_commands([("MULTI",), *commands, ("EXEC",)]))  # type: ignore[no-untyped-call]
        errors = [e for e in (_read(conn) for _ in range(len(commands) + 1)) if isinstance(e, ResponseError)]
        try:
            replies = conn.read_response()
        except ExecAbortError:
            if errors:  # why Redis discarded the transaction: the command it refused to queue
                raise errors[0] from None
            raise
        if not isinstance(replies, list) or len(replies) != len(commands):  # never a reply's values in a message
            got = f"{len(replies)} replies" if isinstance(replies, list) else type(replies).__name__
            raise redis.ConnectionError(f"an EXEC of {len(commands)} commands answered {got}")
        return replies
    except ResponseError:
        raise  # read whole: the connection stays in step
    except BaseException:
        conn.disconnect()  # type: ignore[no-untyped-call]
        raise


def _read(conn: redis.Connection) -> Any:
    try:
        return conn.read_response()
    except ResponseError as exc:
        return exc


def _pairs(raw: Any) -> dict[str, str]:
    """An HGETALL reply as a dict of text: raw (a flat list of field, value, ...) or as redis-py
    parses it (a dict), in bytes or text."""

    def text(x: Any) -> str:
        return x.decode() if isinstance(x, bytes) else str(x)

    if isinstance(raw, dict):
        return {text(k): text(v) for k, v in raw.items()}
    items = list(raw or ())
    return {text(items[i]): text(items[i + 1]) for i in range(0, len(items) - 1, 2)}
