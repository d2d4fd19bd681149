"""Cap leases: reserve a slot under every cap of a buyer in one Lua call, then confirm or
refund exactly what was reserved. Shared by the lead path, settlement and reconciliation."""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING

import redis
from redis.exceptions import AskError, ClusterError

from webhooks import metrics
from webhooks.caps.windows import Window, window
from webhooks.storage import keys
from webhooks.storage import redis as redis_store
from webhooks.storage.redis import Store

if TYPE_CHECKING:
    from webhooks.leads.buyers import BuyerRule

# Counters outlive their window a little so a late refund still finds them; the key name
# carries the window, so a new window always starts from a new key at 0.
EXPIRY_GRACE = timedelta(hours=1)
CONFIRMED_TTL_MS = 48 * 3600 * 1000
WITHDRAWN = "withdrawn"  # finish_lease outcome: a refund that leaves the breaker alone


@dataclass(frozen=True)
class Lease:
    buyer_id: str
    lease_id: str
    counters: tuple[str, ...]
    probe: bool = False
    reserved_us: int = 0  # Redis time of the reservation; reconciliation orders sales by it
    dedupe: tuple[str, ...] = ()  # the consumer's dedupe keys this lease set

    @property
    def key(self) -> str:
        return keys.lease(self.buyer_id, self.lease_id)


@dataclass(frozen=True)
class Note:
    """A record written in the same round trip as a reservation (never after it): what the
    caller is about to do with the lease. JSON of `fields` plus buyer_id, lease_id, counters."""

    key: str
    fields: dict
    ttl_ms: int

    def value(self, lease: Lease) -> str:
        return json.dumps({**self.fields, "buyer_id": lease.buyer_id, "lease_id": lease.lease_id,
                           "counters": list(lease.counters), "dedupe": list(lease.dedupe)},
                          separators=(",", ":"))


@dataclass(frozen=True)
class Reservation:
    status: str  # ok | full | duplicate | circuit_open | not_ready
    lease: Lease | None = None
    cap: str | None = None  # the full cap, when status == "full"


def windows(buyer: BuyerRule, now: datetime) -> list[tuple[str, int, Window]]:
    """(cap, limit, window) of every cap the buyer has, at `now` (aware)."""
    return [(cap, limit, window(cap, buyer.tz, now)) for cap, limit in buyer.limits]


def counter_key(buyer_id: str, w: Window) -> str:
    return keys.cap_counter(buyer_id, w.cap, w.label)


def expire_at(w: Window) -> int:
    return int((w.end + EXPIRY_GRACE).timestamp())


@dataclass(frozen=True)
class PendingReservation:
    """One call of lua/reserve_lease.lua, prepared: its keys and arguments, the lease it will
    open (its id is chosen here, so a note can name it before the call), and how to read the
    script's answer."""

    script_keys: list
    args: list
    lease: Lease
    caps: list

    def queue(self, store: Store, pipe) -> None:
        """Add the call to `pipe` (a pipeline of `store.redis`), to share a round trip."""
        store.queue(pipe, store.reserve_lease, self.script_keys, self.args)

    def result(self, raw: list) -> Reservation:
        status, lease = raw[0], self.lease
        if status == "ok":
            return Reservation("ok", Lease(lease.buyer_id, lease.lease_id, lease.counters, bool(raw[1]),
                                           int(raw[2]), lease.dedupe))
        if status == "full":
            cap = self.caps[int(raw[1]) - 1][0]
            metrics.cap_refused(lease.buyer_id, cap)
            return Reservation("full", cap=cap)
        return Reservation(status)


def prepare(buyer: BuyerRule, now: datetime, *, lease_ttl_ms: int, probe_ttl_ms: int,
            consumer: Sequence[str] = (), price_minor: int | None = None, note_key: str = "") -> PendingReservation:
    """The reservation of one lead under every cap of `buyer` at `now` (all or nothing),
    refused as a duplicate when one of `consumer`'s dedupe keys is set. `price_minor`
    (default: the buyer's price) is what counts against daily_budget. `note_key`, the
    attempt note written beside it, is kept in the lease (its `note` field)."""
    caps = windows(buyer, now)
    counters = [counter_key(buyer.id, w) for _, _, w in caps]
    lease_id = os.urandom(12).hex()
    amount = buyer.price_minor if price_minor is None else price_minor
    args: list = [lease_id, lease_ttl_ms, probe_ttl_ms, len(caps)]
    for cap, limit, w in caps:
        args += [limit, amount if cap == "daily_budget" else 1, expire_at(w)]
    args += [buyer.dedupe_days * 86_400_000, note_key]
    script_keys = [keys.ready(buyer.id), keys.breaker(buyer.id), keys.lease(buyer.id, lease_id),
                   keys.leases(buyer.id), *counters, *consumer]
    return PendingReservation(script_keys, args, Lease(buyer.id, lease_id, tuple(counters), dedupe=tuple(consumer)),
                              caps)


def reserve(store: Store, buyer: BuyerRule, now: datetime, *, lease_ttl_ms: int, probe_ttl_ms: int,
            note: Note | None = None, consumer: Sequence[str] = (), price_minor: int | None = None
            ) -> Reservation:
    """`prepare` and make the reservation. `note`, if given, is written in the same round
    trip, whatever the outcome."""
    call = prepare(buyer, now, lease_ttl_ms=lease_ttl_ms, probe_ttl_ms=probe_ttl_ms, consumer=consumer,
                   price_minor=price_minor, note_key="" if note is None else note.key)
    if store.cap_wait.replicas:
        if note is not None:  # WAIT must follow the script on its own connection: a round trip more
            store.redis.set(note.key, note.value(call.lease), px=note.ttl_ms)
        return call.result(_reserve_replicated(store, call.lease, call.script_keys, call.args))
    if note is None:
        return call.result(store.reserve_lease(keys=call.script_keys, args=call.args))
    pipe = store.redis.pipeline(transaction=False)
    call.queue(store, pipe)
    pipe.set(note.key, note.value(call.lease), px=note.ttl_ms)
    return call.result(pipe.execute()[0])


def _reserve_replicated(store: Store, lease: Lease, script_keys: list[str], args: list) -> list:
    """reserve_lease, then WAIT for `store.cap_wait.replicas` replicas on the same connection to
    the buyer's node (WAIT counts the replicas holding every write of its own connection).
    Replication is asynchronous: without this, a failover right after a reservation can
    forget it and let the cap be exceeded. A reservation not held by enough replicas in time
    is withdrawn and raises redis.TimeoutError (the lead path answers 503: retry)."""
    wait, r = store.cap_wait, store.redis
    for attempt in range(2):  # a second time only after the slot moved (MOVED / ASK)
        pipe = redis_store.node_of(r, script_keys[0]).pipeline(transaction=False)
        store.queue(pipe, store.reserve_lease, script_keys, args)
        pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
        try:
            result, acked = pipe.execute()
            break
        except redis_store.REDIS_DOWN:
            redis_store.refresh_slots(r)  # the node is gone: learn the new primary for the next lead
            raise
        except AskError:
            redis_store.refresh_slots(r)
            if attempt:
                raise ClusterError(f"the slot of {script_keys[0]} is moving; retry") from None
    if result[0] == "ok" and acked < wait.replicas:
        withdraw(store, lease)
        raise redis.TimeoutError(f"{acked} of {wait.replicas} replica(s) acknowledged the cap "
                                 f"reservation within {wait.timeout_ms} ms")
    return result


def take_over(store: Store, lease: Lease, ttl_ms: int) -> tuple[str, int]:
    """Extend the held lease of a routing whose process died: (state, reserved at us), state
    held or confirmed, or ("gone", 0) when it was refunded or has expired."""
    result = store.extend_lease(keys=[lease.key, keys.leases(lease.buyer_id), *lease.dedupe],
                                args=[ttl_ms, lease.lease_id])
    return (result[0], int(result[1])) if result[0] != "gone" else ("gone", 0)


def _finish_call(lease: Lease, outcome: str, breaker_failures: int, breaker_cooldown_ms: int):
    return ([lease.key, keys.breaker(lease.buyer_id), keys.leases(lease.buyer_id), *lease.counters, *lease.dedupe],
            [outcome, breaker_failures, breaker_cooldown_ms, CONFIRMED_TTL_MS, lease.lease_id])


def finish(store: Store, lease: Lease, outcome: str, *, breaker_failures: int, breaker_cooldown_ms: int) -> bool:
    """Confirm (accepted) or refund (rejected, error, timeout) `lease`; feed the breaker."""
    k, a = _finish_call(lease, outcome, breaker_failures, breaker_cooldown_ms)
    return bool(store.finish_lease(keys=k, args=a))


def withdraw(store: Store, lease: Lease) -> None:
    """Give back a reservation that will not be offered (the breaker is left alone). If Redis
    cannot be reached the slot stays taken, which is safe; reconciliation gives it back."""
    try:
        finish(store, lease, WITHDRAWN, breaker_failures=0, breaker_cooldown_ms=0)
    except redis_store.REDIS_DOWN:
        pass


def finish_in(store: Store, pipe, lease: Lease, outcome: str, *, breaker_failures: int,
              breaker_cooldown_ms: int) -> None:
    """`finish`, queued on `pipe` (a pipeline of `store.redis`) to share a round trip."""
    k, a = _finish_call(lease, outcome, breaker_failures, breaker_cooldown_ms)
    store.queue(pipe, store.finish_lease, k, a)


def release_settled(r, leases: list[tuple[str, str]]) -> None:
    """These sales are in the ledger now: their confirmed leases (buyer id, lease id) no
    longer need counting. One round trip for the lot."""
    if not leases:
        return
    pipe = r.pipeline(transaction=False)
    for buyer_id, lease_id in leases:
        pipe.delete(keys.lease(buyer_id, lease_id))
        pipe.zrem(keys.leases(buyer_id), lease_id)
    pipe.execute()


def room(store: Store, buyers: Sequence[BuyerRule], now: datetime, budget_minor: dict[str, int] | None = None,
         consumers: dict[str, Sequence[str]] | None = None) -> dict[str, str | None]:
    """Whether each buyer could take one more lead now, read without reserving (one round
    trip): None, or why not: "duplicate", "cap_full:<cap>" or "circuit_open". `budget_minor`
    is the least a buyer's lead can count against daily_budget (default: its price);
    `consumers` the lead's dedupe keys per buyer. A lead that passes here still reserves
    atomically later; this only spares buyers a ping they must not or cannot win."""
    pipe = store.redis.pipeline(transaction=False)
    plans = []
    for buyer in buyers:
        caps = windows(buyer, now)
        consumer = (consumers or {}).get(buyer.id) or ()
        pipe.hget(keys.breaker(buyer.id), "open_until")
        pipe.exists(*consumer) if consumer else pipe.echo("0")
        for _, _, w in caps:
            pipe.get(counter_key(buyer.id, w))
        plans.append((buyer, caps))
    values = iter(pipe.execute()) if plans else iter(())
    now_ms = now.timestamp() * 1000
    out: dict[str, str | None] = {}
    for buyer, caps in plans:
        open_until, known = int(next(values) or 0), int(next(values) or 0)
        used = [int(next(values) or 0) for _ in caps]
        amount = (budget_minor or {}).get(buyer.id, buyer.price_minor)
        full = [cap for (cap, limit, _), u in zip(caps, used) if u + (amount if cap == "daily_budget" else 1) > limit]
        out[buyer.id] = ("duplicate" if known else f"cap_full:{full[0]}" if full
                         else "circuit_open" if open_until > now_ms else None)
    return out


def mark_ready(r, buyer_id: str) -> None:
    """A buyer with no history yet: its counters (all zero) can be trusted as they are."""
    r.set(keys.ready(buyer_id), "1", nx=True)


def usage(r, buyer: BuyerRule, now: datetime | None = None) -> dict:
    """Live use of each cap in its current window, for the admin API and the ops page."""
    now = now or datetime.now(timezone.utc)
    caps = windows(buyer, now)
    values = r.mget([counter_key(buyer.id, w) for _, _, w in caps]) if caps else []
    out = {}
    for (cap, limit, w), raw in zip(caps, values):
        used = int(raw or 0)
        if cap == "daily_budget":
            out[cap] = {"used": f"{Decimal(used) / 100:.2f}", "limit": f"{Decimal(limit) / 100:.2f}"}
        else:
            out[cap] = {"used": used, "limit": limit}
        out[cap]["window_start"] = w.start.isoformat()
    return out
