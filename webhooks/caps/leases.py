"""Cap leases: reserve a slot under every cap of a buyer in one Lua call, then confirm or
refund exactly what was reserved (`finish`; `withdraw` refunds one never offered, leaving
the breaker alone). Shared by the lead path, settlement and reconciliation."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Protocol
from zoneinfo import ZoneInfo

import redis
from redis.exceptions import AskError, ClusterError

from webhooks import metrics
from webhooks.billing.balance import Billing
from webhooks.caps.windows import Window, window
from webhooks.storage.live import keys
from webhooks.storage.live import redis as redis_store
from webhooks.storage.live.batch import Batch, Client, Pending
from webhooks.storage.live.redis import Store
from webhooks.storage.live.scripts import NO_HOLD, BreakerRule, Charge, Extended, Hold, Lease, Reserved
from webhooks.storage.states import AttemptOutcome, Circuit, ReservationStatus

# Counters outlive their window a little so a late refund still finds them; the key name
# carries the window, so a new window always starts from a new key at 0.
EXPIRY_GRACE = timedelta(hours=1)
CONFIRMED_TTL_MS = 48 * 3600 * 1000
WITHDRAWN = AttemptOutcome.WITHDRAWN  # finish_lease outcome: a refund that leaves the breaker alone


class CappedBuyer(Protocol):
    """What caps read of a buyer (the lead path's rule, leads/rules/buyers.py BuyerRule, is
    one): its caps in its time zone, its price, its dedupe window and its billing."""

    @property
    def id(self) -> str: ...
    @property
    def tz(self) -> ZoneInfo: ...
    @property
    def limits(self) -> tuple[tuple[str, int], ...]: ...  # (cap, limit); daily_budget in minor units
    @property
    def price_minor(self) -> int: ...
    @property
    def dedupe_fields(self) -> tuple[str, ...]: ...
    @property
    def dedupe_days(self) -> int: ...
    @property
    def billing(self) -> Billing | None: ...


@dataclass(frozen=True)
class Note:
    """A record written in the same round trip as a reservation (never after it): what the
    caller is about to do with the lease. JSON of `fields` plus buyer_id, lease_id, counters."""

    key: str
    fields: dict[str, Any]
    ttl_ms: int

    def value(self, lease: Lease) -> str:
        return json.dumps(
            {
                **self.fields,
                "buyer_id": lease.buyer_id,
                "lease_id": lease.lease_id,
                "counters": list(lease.counters),
                "dedupe": list(lease.dedupe),
            },
            separators=(",", ":"),
        )


@dataclass(frozen=True)
class Reservation:
    status: ReservationStatus
    lease: Lease | None = None
    cap: str | None = None  # the full cap, when status is FULL
    circuit: Circuit | None = None  # the open circuit, when status is CIRCUIT_OPEN


def windows(buyer: CappedBuyer, now: datetime) -> list[tuple[str, int, Window]]:
    """(cap, limit, window) of every cap the buyer has, at `now` (aware)."""
    return [(cap, limit, window(cap, buyer.tz, now)) for cap, limit in buyer.limits]


def counter_key(buyer_id: str, w: Window) -> str:
    return keys.cap_counter(buyer_id, w.cap, w.label)


def expire_at(w: Window) -> int:
    return int((w.end + EXPIRY_GRACE).timestamp())


@dataclass(frozen=True, kw_only=True)
class PreparedReservation:
    """One reservation of a lead at a buyer (lua/reserve_lease.lua), prepared: the lease it
    will open (its id is chosen here, so a note can name it before the call), what it adds to
    each counter, and the caps those counters are of."""

    lease: Lease
    charges: tuple[Charge, ...]
    caps: tuple[str, ...]
    lease_ttl_ms: int
    probe_ttl_ms: int
    dedupe_ms: int
    note_key: str
    hold: Hold = NO_HOLD

    def send(self, store: Store) -> Reservation:
        """Make the reservation, in a round trip of its own."""
        return self.result(
            store.reserve_lease(
                self.lease,
                self.charges,
                lease_ttl_ms=self.lease_ttl_ms,
                probe_ttl_ms=self.probe_ttl_ms,
                dedupe_ms=self.dedupe_ms,
                note_key=self.note_key,
                hold=self.hold,
            )
        )

    def queue(self, batch: Batch) -> Pending[Reservation]:
        """Add the reservation to `batch`, to share its round trip."""
        return batch.reserve_lease(
            self.lease,
            self.charges,
            lease_ttl_ms=self.lease_ttl_ms,
            probe_ttl_ms=self.probe_ttl_ms,
            dedupe_ms=self.dedupe_ms,
            note_key=self.note_key,
            hold=self.hold,
        ).then(self.result)

    def result(self, reserved: Reserved) -> Reservation:
        lease = self.lease
        if reserved.status is ReservationStatus.OK:
            return Reservation(
                reserved.status, dataclasses.replace(lease, probe=reserved.probe, reserved_us=reserved.reserved_us)
            )
        if reserved.status is ReservationStatus.FULL and reserved.full is not None:
            cap = self.caps[reserved.full]
            metrics.cap_refused(lease.buyer_id, cap)
            return Reservation(reserved.status, cap=cap)
        return Reservation(reserved.status, circuit=reserved.circuit)


def prepare(
    buyer: CappedBuyer,
    now: datetime,
    *,
    lease_ttl_ms: int,
    probe_ttl_ms: int,
    consumer: Sequence[str] = (),
    price_minor: int | None = None,
    note_key: str = "",
    publisher_id: str = "",
    hold: Hold = NO_HOLD,
) -> PreparedReservation:
    """The reservation of one lead under every cap of `buyer` at `now` (all or nothing),
    refused as a duplicate when one of `consumer`'s dedupe keys is set, or while the buyer's
    circuit, or its circuit for `publisher_id`, is open. `price_minor` (default: the buyer's
    price) is what counts against daily_budget. `note_key`, the attempt note written beside
    it, is kept in the lease (its `note` field). `hold`: what a billed buyer's balance must
    afford, held with the caps (billing/balance.py)."""
    caps = windows(buyer, now)
    amount = buyer.price_minor if price_minor is None else price_minor
    lease = Lease(
        buyer.id,
        os.urandom(12).hex(),
        tuple(counter_key(buyer.id, w) for _, _, w in caps),
        dedupe=tuple(consumer),
        publisher_id=publisher_id,
    )
    charges = tuple(Charge(limit, amount if cap == "daily_budget" else 1, expire_at(w)) for cap, limit, w in caps)
    return PreparedReservation(
        lease=lease,
        charges=charges,
        caps=tuple(cap for cap, _, _ in caps),
        lease_ttl_ms=lease_ttl_ms,
        probe_ttl_ms=probe_ttl_ms,
        dedupe_ms=buyer.dedupe_days * 86_400_000,
        note_key=note_key,
        hold=hold,
    )


def reserve(
    store: Store,
    buyer: CappedBuyer,
    now: datetime,
    *,
    lease_ttl_ms: int,
    probe_ttl_ms: int,
    note: Note | None = None,
    consumer: Sequence[str] = (),
    price_minor: int | None = None,
    publisher_id: str = "",
    hold: Hold = NO_HOLD,
) -> Reservation:
    """`prepare` and make the reservation. `note`, if given, is written in the same round
    trip, whatever the outcome."""
    call = prepare(
        buyer,
        now,
        lease_ttl_ms=lease_ttl_ms,
        probe_ttl_ms=probe_ttl_ms,
        consumer=consumer,
        price_minor=price_minor,
        note_key="" if note is None else note.key,
        publisher_id=publisher_id,
        hold=hold,
    )
    if store.cap_wait.replicas:
        if note is not None:  # WAIT must follow the script on its own connection: a round trip more
            store.redis.set(note.key, note.value(call.lease), px=note.ttl_ms)
        return send_replicated(store, call)
    if note is None:
        return call.send(store)
    with store.batch() as b:
        reserved = call.queue(b)
        b.set(note.key, note.value(call.lease), px=note.ttl_ms)
    return reserved.value


def send_replicated(store: Store, call: PreparedReservation) -> Reservation:
    """reserve_lease, then WAIT for `store.cap_wait.replicas` replicas on the same connection to
    the buyer's node (WAIT counts the replicas holding every write of its own connection).
    Replication is asynchronous: without this, a failover right after a reservation can
    forget it and let the cap be exceeded. A reservation not held by enough replicas in time
    is withdrawn and raises redis.TimeoutError (the lead path answers 503: retry)."""
    wait, r = store.cap_wait, store.redis
    for attempt in range(2):  # a second time only after the slot moved (MOVED / ASK)
        b = store.batch(on_node_of=call.lease.key)
        reserved = call.queue(b)
        acked = b.wait(wait.replicas, wait.timeout_ms)
        try:
            b.execute()
            break
        except redis_store.REDIS_DOWN:
            redis_store.refresh_slots(r)  # the node is gone: learn the new primary for the next lead
            raise
        except AskError:
            redis_store.refresh_slots(r)
            if attempt:
                raise ClusterError(f"the slot of {call.lease.key} is moving; retry") from None
    result = reserved.value
    if result.lease is not None and acked.value < wait.replicas:
        withdraw(store, result.lease)
        raise redis.TimeoutError(
            f"{acked.value} of {wait.replicas} replica(s) acknowledged the cap reservation within {wait.timeout_ms} ms"
        )
    return result


def take_over(store: Store, lease: Lease, ttl_ms: int) -> Extended:
    """Extend the held lease of a routing whose process died: (state, reserved at us), state
    held or confirmed, or (gone, 0) when it was refunded or has expired."""
    return store.extend_lease(lease, ttl_ms)


def finish(
    store: Store,
    lease: Lease,
    outcome: AttemptOutcome | str,
    *,
    breaker_failures: int,
    breaker_cooldown_ms: int,
    replied: bool = True,
) -> bool:
    """Confirm (accepted) or refund (rejected, error, timeout) `lease`; feed the buyer's
    circuits (`replied`: an ERROR came with the buyer's reply, see scripts.finish_lease)."""
    return store.finish_lease(
        lease, outcome, BreakerRule(breaker_failures, breaker_cooldown_ms), CONFIRMED_TTL_MS, replied=replied
    )


def withdraw(store: Store, lease: Lease) -> None:
    """Give back a reservation that will not be offered (the breaker is left alone). If Redis
    cannot be reached the slot stays taken, which is safe; reconciliation gives it back."""
    try:
        store.finish_lease(lease, WITHDRAWN, BreakerRule(0, 0), CONFIRMED_TTL_MS)
    except redis_store.REDIS_DOWN:
        pass


def finish_in(
    batch: Batch, lease: Lease, outcome: AttemptOutcome, breaker: BreakerRule, *, replied: bool = True
) -> Pending[bool]:
    """`finish`, queued in `batch` to share its round trip."""
    return batch.finish_lease(lease, outcome, breaker, CONFIRMED_TTL_MS, replied=replied)


def release_settled(r: Client, leases: list[tuple[str, str]]) -> None:
    """These sales are in the ledger now: their confirmed leases (buyer id, lease id) no
    longer need counting. One round trip for the lot."""
    if not leases:
        return
    pipe = r.pipeline(transaction=False)
    for buyer_id, lease_id in leases:
        pipe.delete(keys.lease(buyer_id, lease_id))
        pipe.zrem(keys.leases(buyer_id), lease_id)
    pipe.execute()


def room(
    store: Store,
    buyers: Sequence[CappedBuyer],
    now: datetime,
    *,
    budget_minor: dict[str, int] | None = None,
    consumers: Mapping[str, Sequence[str]] | None = None,
    publisher_id: str = "",
    holds: Mapping[str, Hold] | None = None,
) -> dict[str, str | None]:
    """Whether each buyer could take one more lead of `publisher_id` now, read without
    reserving (one round trip): None, or why not: "duplicate", "cap_full:<cap>" or
    "circuit_open" (the buyer's circuit, or its circuit for the publisher). `budget_minor`
    is the least a buyer's lead can count against daily_budget (default: its price);
    `consumers` the lead's dedupe keys per buyer. A lead that passes here still reserves
    atomically later; this only spares buyers a ping they must not or cannot win.

    With `holds` (what the lead would hold against each buyer's balance, Buyer.hold) the
    read is as strict as lua/reserve_lease.lua: also "not_ready" (counters not trusted, or
    a billed buyer's balance not known) and "balance" (it cannot afford the lead)."""
    with store.batch() as b:
        plans = []
        for buyer in buyers:
            caps = windows(buyer, now)
            consumer = (consumers or {}).get(buyer.id) or ()
            hold = None if holds is None else holds.get(buyer.id, NO_HOLD)
            plans.append(
                (
                    buyer,
                    caps,
                    (
                        b.hget(keys.breaker(buyer.id), "open_until"),
                        b.hget(keys.publisher_breaker(buyer.id, publisher_id), "open_until"),
                    ),
                    b.exists(*consumer) if consumer else None,
                    [b.get(counter_key(buyer.id, w)) for _, _, w in caps],
                    None if hold is None else b.exists(keys.ready(buyer.id)),
                    None
                    if hold is None or hold.amount_minor <= 0
                    else (hold, b.hmget(store.balance_key(buyer.id, hold.wallet), ["wallet", "held"])),
                )
            )
    now_ms = now.timestamp() * 1000
    out: dict[str, str | None] = {}
    for buyer, caps, circuits, known, counters, ready, billed in plans:
        used = [int(c.value or 0) for c in counters]
        amount = (budget_minor or {}).get(buyer.id, buyer.price_minor)
        full = [cap for (cap, limit, _), u in zip(caps, used) if u + (amount if cap == "daily_budget" else 1) > limit]
        out[buyer.id] = (
            ReservationStatus.NOT_READY
            if ready is not None and not ready.value
            else ReservationStatus.DUPLICATE
            if known is not None and known.value
            else f"cap_full:{full[0]}"
            if full
            else ReservationStatus.CIRCUIT_OPEN
            if any(int(open_until.value or 0) > now_ms for open_until in circuits)
            else None
            if billed is None
            else _afford(*billed)
        )
    return out


def _afford(hold: Hold, balance: Pending[list[Any]]) -> str | None:
    """Whether a billed buyer's balance in Redis takes `hold` (lua/reserve_lease.lua's test)."""
    wallet, held = balance.value
    if wallet is None:
        return ReservationStatus.NOT_READY
    if int(wallet) - int(held or 0) - hold.amount_minor < hold.floor_minor:
        return ReservationStatus.BALANCE
    return None


def mark_ready(r: Client, buyer_id: str) -> None:
    """A buyer with no history yet: its counters (all zero) can be trusted as they are."""
    r.set(keys.ready(buyer_id), "1", nx=True)


def usage(r: Client, buyer: CappedBuyer, now: datetime | None = None) -> dict[str, Any]:
    """Live use of each cap in its current window, for the admin API and the ops page."""
    return usage_many(r, [buyer], now)[buyer.id]


def usage_many(r: Client, buyers: Sequence[CappedBuyer], now: datetime | None = None) -> dict[str, dict[str, Any]]:
    """`usage` of many buyers, by buyer id, read in one round trip."""
    now = now or datetime.now(timezone.utc)
    caps = [windows(buyer, now) for buyer in buyers]
    pipe = r.pipeline(transaction=False)  # GETs: a Redis Cluster's pipeline refuses MGET
    for buyer, its in zip(buyers, caps):
        for _, _, w in its:
            pipe.get(counter_key(buyer.id, w))
    replies = iter(pipe.execute() if any(caps) else [])
    result: dict[str, dict[str, Any]] = {}
    for buyer, its in zip(buyers, caps):
        out: dict[str, dict[str, Any]] = {}
        for cap, limit, w in its:
            used = int(next(replies) or 0)
            if cap == "daily_budget":
                out[cap] = {"used": f"{Decimal(used) / 100:.2f}", "limit": f"{Decimal(limit) / 100:.2f}"}
            else:
                out[cap] = {"used": used, "limit": limit}
            out[cap]["window_start"] = w.start.isoformat()
        result[buyer.id] = out
    return result
