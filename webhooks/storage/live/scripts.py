"""Every Lua script's call, typed: what it is given, the KEYS it builds from `keys.py`, and the
named result its reply is read into. `Store` (storage/live/redis.py) sends a call on its own and
`Batch` (storage/live/batch.py) queues it beside others; both take the call from here, so the
order of KEYS and ARGV (each script's header) is written down once, in this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, NamedTuple, TypeVar

from webhooks.storage.live import keys
from webhooks.storage.states import (
    AttemptOutcome,
    Circuit,
    ClaimOutcome,
    GateVerdict,
    LeaseState,
    ReservationStatus,
    SnapshotStatus,
)

T = TypeVar("T")
Arg = str | int


@dataclass(frozen=True)
class Call(Generic[T]):
    """One script call, ready to send: lua/<name>.lua, its KEYS (all in one hash slot; the
    first names the node on a cluster) and ARGV, and how its reply is read."""

    name: str
    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    read: Callable[[Any], T]


# --- what the scripts are given -------------------------------------------------------------


class LeadKey(NamedTuple):
    """A lead, as its publisher names it: the keys of its claim, attempt note and the
    publisher's replay memory mark."""

    publisher_id: str
    lead_id: str

    @property
    def claim(self) -> str:
        return keys.lead_claim(self.publisher_id, self.lead_id)

    @property
    def attempt(self) -> str:
        return keys.lead_attempt(self.publisher_id, self.lead_id)


@dataclass(frozen=True)
class Lease:
    """A cap reservation: the counters it incremented and the consumer's dedupe keys it set."""

    buyer_id: str
    lease_id: str
    counters: tuple[str, ...]
    probe: bool = False
    reserved_us: int = 0  # Redis time of the reservation; reconciliation orders sales by it
    dedupe: tuple[str, ...] = ()  # the consumer's dedupe keys this lease set
    # whose lead it holds: the buyer's circuit for that publisher gates and counts it ("": none
    # known, a failed reply then counts for the buyer's own circuit)
    publisher_id: str = ""

    @property
    def key(self) -> str:
        return keys.lease(self.buyer_id, self.lease_id)


class Hold(NamedTuple):
    """What a reservation holds against a billed buyer's balance, and the floor it may not
    take the balance below (0, or minus the credit limit); NO_HOLD for a buyer not billed."""

    amount_minor: int
    floor_minor: int = 0
    wallet: str = ""  # "<account>|<currency>": whose balance it draws on (keys.balance_of)


NO_HOLD = Hold(0)


class Balance(NamedTuple):
    """A billed buyer's balance in Redis after lua/sync_balance.lua (None: not known), and its
    cycle (the wallet version that last raised it: balance events go out once per cycle)."""

    wallet_minor: int
    held_minor: int
    cycle: int = 0


class Charge(NamedTuple):
    """What a reservation adds to one counter of its lease, and under which limit."""

    limit: int
    amount: int
    expire_at: int  # unix s, for a counter the reservation creates


# Publishers whose circuits at one buyer, open within a cool-down of each other, open the
# buyer's circuit for every publisher (docs/leads.md "Circuit breakers" says why three).
BREAKER_PUBLISHERS = 3
BREAKER_MEMORY_MS = 86_400_000  # a publisher's circuit untouched this long is forgotten (closed)


class BreakerRule(NamedTuple):
    """BREAKER_FAILURES and BREAKER_COOLDOWN_MS: failures in a row that open a circuit of a
    buyer (its own, or its circuit for one publisher), and for how long."""

    failures: int
    cooldown_ms: int
    publishers: int = BREAKER_PUBLISHERS
    memory_ms: int = BREAKER_MEMORY_MS


class PaymentRef(NamedTuple):
    """A payment's (or, with `refund`, a refund's: a key space of its own) reference."""

    provider: str
    reference: str
    refund: bool = False

    def key(self, what: str) -> str:
        return (keys.refund if self.refund else keys.payment)(self.provider, self.reference, what)

    @property
    def marker(self) -> str:
        """Holds the fingerprint of what was credited (or debited) under this reference."""
        return self.key("processed")

    @property
    def claim(self) -> str:
        return self.key("claim")

    @property
    def audited(self) -> str:
        """The (verdict, body SHA-256) pairs whose audit row was handed over for writing."""
        return self.key("audited")


class Backlog(StrEnum):
    """The write-behind lists a drain job takes batches of (workers/settle.py)."""

    SETTLEMENTS = "settlements"  # routed leads for the ledger
    PAYMENT_AUDIT = "payment_audit"  # audit rows of payment webhooks that changed nothing

    def keys(self, job_id: str) -> tuple[str, str]:
        if self is Backlog.SETTLEMENTS:
            return keys.SETTLE_PENDING, keys.settle_processing(job_id)
        return keys.WEBHOOK_CALLS_PENDING, keys.webhook_calls_processing(job_id)


# --- what they answer -----------------------------------------------------------------------


class LeadClaim(NamedTuple):
    """lua/claim_lead.lua's answer. `held`: what the claim holds when another request has it
    (its token) or it holds the lead's answer; `dead_note`: the attempt note a dead request
    left, when CLAIMED after one; `memory_mark`: since when (ms, 0: always) Redis remembers
    every answer given to the publisher."""

    outcome: ClaimOutcome
    held: str | None
    dead_note: str | None
    memory_mark: int
    full: int = 0  # CAPPED: which of the publisher's cap counters is full (1-based)
    tokens: int = -1  # the whole tokens the publisher's bucket has left (-1: none was taken)
    wait_ms: int = 0  # THROTTLED: until the bucket's next token


class CapCounter(NamedTuple):
    """One of a publisher's cap counters of the current window, for lua/claim_lead.lua."""

    key: str  # keys.publisher_cap
    limit: int
    ttl_s: int  # it outlives its window, then expires


class Prechecked(NamedTuple):
    """lua/take_precheck.lua's answer: `taken`; `used` the pre-pings of the window with this
    one (taken), or the hour boundaries to wait (refused); `quota` the window's quota."""

    taken: bool
    used: int
    quota: int
    wait_hours: int = 0


class Answered(NamedTuple):
    """lua/answer_lead.lua's answer: written, or what the claim holds (another request's)."""

    written: bool
    held: str | None


class Claimed(NamedTuple):
    """lua/claim_or_get.lua's answer: ours, or who holds it."""

    claimed: bool
    held: str | None


class Reserved(NamedTuple):
    """lua/reserve_lease.lua's answer; `full` is the index of the full counter, `circuit`
    the open one (CIRCUIT_OPEN)."""

    status: ReservationStatus
    probe: bool = False
    reserved_us: int = 0
    full: int | None = None
    circuit: Circuit | None = None


class Extended(NamedTuple):
    """lua/extend_lease.lua's answer: the lease's state and when it was reserved (0: gone)."""

    state: LeaseState
    reserved_us: int


class CapSnapshot(NamedTuple):
    """lua/snapshot_caps.lua's answer: at Redis time `at_us`, each counter's value and, per
    live lease, its amount per counter (both in the order of the counters asked for)."""

    status: SnapshotStatus
    at_us: int = 0
    counters: tuple[int, ...] = ()
    leases: dict[str, tuple[int, ...]] = {}


class GateReply(NamedTuple):
    """lua/payment_gate.lua's answer; `enqueue_drain`: the audit row it queued needs a drain
    job; `queue_row`: the caller must queue the audit row (the script queued none and has not
    seen these bytes under this verdict before)."""

    verdict: GateVerdict
    enqueue_drain: bool
    queue_row: bool


# --- the calls ------------------------------------------------------------------------------


def _lead_claim(raw: list[Any]) -> LeadClaim:
    code, value, mark, tokens = raw
    if code == 1:
        return LeadClaim(ClaimOutcome.CLAIMED, None, value, int(mark), tokens=tokens)
    if code == 2:
        return LeadClaim(ClaimOutcome.WAIT, None, None, int(mark), tokens=tokens)
    if code == 3:
        return LeadClaim(ClaimOutcome.CAPPED, None, None, int(mark), int(value), tokens=tokens)
    if code == 4:
        return LeadClaim(ClaimOutcome.THROTTLED, None, None, 0, wait_ms=int(value))
    return LeadClaim(ClaimOutcome.HELD, value, None, int(mark), tokens=tokens)


def claim_lead(
    lead: LeadKey,
    token: str,
    ttl_ms: int,
    now_ms: int,
    *,
    note: str,
    note_ttl_ms: int,
    caps: Sequence[CapCounter] = (),
    bucket: tuple[int, int] | None = None,
) -> Call[LeadClaim]:
    per_second, burst = bucket or (0, 0)
    limits: list[str | int] = []
    for cap in caps:
        limits += [cap.limit, cap.ttl_s]
    publisher = lead.publisher_id
    return Call(
        "claim_lead",
        (lead.claim, lead.attempt, keys.lead_memory(publisher), keys.rate_bucket(publisher), *(c.key for c in caps)),
        (token, ttl_ms, note, note_ttl_ms, now_ms, per_second, burst, *limits),
        _lead_claim,
    )


def answer_lead(lead: LeadKey, token: str, answer: str, ttl_s: int) -> Call[Answered]:
    return Call(
        "answer_lead",
        (lead.claim, lead.attempt),
        (token, answer, ttl_s),
        lambda raw: Answered(True, None) if raw == 1 else Answered(False, raw),
    )


def restore_answer(lead: LeadKey, answer: str, ttl_s: int) -> Call[bool]:
    return Call("restore_answer", (lead.claim,), (answer, ttl_s), bool)


def claim_or_get(key: str, token: str, ttl_ms: int) -> Call[Claimed]:
    return Call(
        "claim_or_get",
        (key,),
        (token, ttl_ms),
        lambda raw: Claimed(True, None) if raw[0] == 1 else Claimed(False, raw[1]),
    )


def release_claim(key: str, token: str) -> Call[bool]:
    return Call("release_claim", (key,), (token,), bool)


def _reserved(raw: list[Any]) -> Reserved:
    status = ReservationStatus(raw[0])
    if status is ReservationStatus.OK:
        return Reserved(status, bool(raw[1]), int(raw[2]))
    if status is ReservationStatus.FULL:
        return Reserved(status, full=int(raw[1]) - 1)
    if status is ReservationStatus.CIRCUIT_OPEN:
        return Reserved(status, circuit=Circuit(raw[1]))
    return Reserved(status)


def reserve_lease(
    lease: Lease,
    charges: Sequence[Charge],
    *,
    lease_ttl_ms: int,
    probe_ttl_ms: int,
    dedupe_ms: int,
    note_key: str,
    hold: Hold = NO_HOLD,
    shared: bool = True,
) -> Call[Reserved]:
    """`shared`: a wallet's buyers draw on one balance (one Redis; keys.balance_of)."""
    args: list[Arg] = [lease.lease_id, lease_ttl_ms, probe_ttl_ms, len(charges)]
    for charge in charges:
        args += charge
    args += [dedupe_ms, note_key, hold.amount_minor, hold.floor_minor]
    b = lease.buyer_id
    return Call(
        "reserve_lease",
        (
            keys.ready(b),
            keys.breaker(b),
            keys.publisher_breaker(b, lease.publisher_id),
            lease.key,
            keys.leases(b),
            keys.balance_of(b, hold.wallet, shared=shared),
            *lease.counters,
            *lease.dedupe,
        ),
        tuple(args),
        _reserved,
    )


def extend_lease(lease: Lease, ttl_ms: int) -> Call[Extended]:
    return Call(
        "extend_lease",
        (lease.key, keys.leases(lease.buyer_id), *lease.dedupe),
        (ttl_ms, lease.lease_id),
        lambda raw: (
            Extended(LeaseState.GONE, 0) if raw[0] == LeaseState.GONE else Extended(LeaseState(raw[0]), int(raw[1]))
        ),
    )


def finish_lease(
    lease: Lease, outcome: AttemptOutcome | str, breaker: BreakerRule, confirmed_ttl_ms: int, *, replied: bool = True
) -> Call[bool]:
    """`replied`: an ERROR came with a whole reply from the buyer (a 5xx, an unreadable body),
    not from the transport (refused, reset): only such a failure may be about the lead."""
    b = lease.buyer_id
    feed = (
        "unreachable"
        if outcome == AttemptOutcome.TIMEOUT or (outcome == AttemptOutcome.ERROR and not replied)
        else outcome
    )
    return Call(
        "finish_lease",
        (
            lease.key,
            keys.breaker(b),
            keys.leases(b),
            keys.publisher_breaker(b, lease.publisher_id),
            keys.breaker_publishers(b),
            keys.balance(b),
            *lease.counters,
            *lease.dedupe,
        ),
        (
            str(feed),
            breaker.failures,
            breaker.cooldown_ms,
            confirmed_ttl_ms,
            lease.lease_id,
            lease.publisher_id,
            breaker.publishers,
            breaker.memory_ms,
        ),
        bool,
    )


def give_back(buyer_id: str, amounts: Sequence[tuple[str, int]]) -> Call[bool]:
    return Call(
        "give_back",
        (keys.reconciling(buyer_id), *(counter for counter, _ in amounts)),
        tuple(amount for _, amount in amounts),
        bool,
    )


class LedgerBalance(NamedTuple):
    """A billed buyer's wallet as the ledger has it, and the prices of its sales the ledger
    does not have yet (lua/rebuild_counters.lua)."""

    account: str  # "<account>|<currency>"
    wallet_minor: int
    version: int
    unsettled_minor: int


def rebuild_counters(
    buyer_id: str,
    token: str,
    values: Sequence[tuple[str, int, int]],
    balance: LedgerBalance | None = None,
    balance_key: str = "",
) -> Call[bool]:
    """`balance_key`: the balance a billed buyer draws on (keys.balance_of)."""
    args: list[Arg] = [token, *(balance or ("", 0, 0, 0))]
    for _, value, expire_at in values:
        args += [value, expire_at]
    return Call(
        "rebuild_counters",
        (
            keys.ready(buyer_id),
            keys.rebuild_lock(buyer_id),
            balance_key or keys.balance(buyer_id),
            *(counter for counter, _, _ in values),
        ),
        tuple(args),
        bool,
    )


def sync_balance(
    balance_key: str, wallet: LedgerBalance, settled_leases: Sequence[str] = (), *, init: bool = False
) -> Call[Balance | None]:
    """`settled_leases`: the lease keys of sales the ledger now has. `wallet.unsettled_minor`
    is not used here: the settled leases say what to give back."""
    return Call(
        "sync_balance",
        (balance_key, *settled_leases),
        (wallet.account, wallet.wallet_minor, wallet.version, "init" if init else ""),
        lambda raw: Balance(int(raw[0]), int(raw[1]), int(raw[2])) if raw else None,
    )


def _snapshot(n: int) -> Callable[[list[Any]], CapSnapshot]:
    def read(raw: list[Any]) -> CapSnapshot:
        status = SnapshotStatus(raw[0])
        if status is not SnapshotStatus.OK:
            return CapSnapshot(status)
        rows = raw[2 + n :]
        leased = {rows[j]: tuple(int(v) for v in rows[j + 1 : j + 1 + n]) for j in range(0, len(rows), n + 1)}
        return CapSnapshot(status, int(raw[1]), tuple(int(v) for v in raw[2 : 2 + n]), leased)

    return read


def snapshot_caps(buyer_id: str, counters: Sequence[str], lease_ids: Sequence[str]) -> Call[CapSnapshot]:
    return Call(
        "snapshot_caps",
        (keys.ready(buyer_id), keys.leases(buyer_id), *counters, *(keys.lease(buyer_id, i) for i in lease_ids)),
        (len(counters), *lease_ids),
        _snapshot(len(counters)),
    )


class BalanceReconciled(NamedTuple):
    """lua/reconcile_balance.lua's answer: "ok" with what was held before and now, "changed"
    (the buyer's leases changed meanwhile: read them again) or "unknown" (not known: the
    rebuild sets it)."""

    status: str
    held_before: int = 0
    held_now: int = 0


@dataclass(frozen=True, kw_only=True)
class WalletLeases:
    """What lua/reconcile_balance.lua reads of one wallet: each of its buyers' lease ids as
    just read from their zsets, and (lease id, price) of their queued sales."""

    balance_key: str
    wallet: LedgerBalance
    buyers: tuple[tuple[str, tuple[str, ...]], ...]  # (buyer id, its zset's lease ids)
    queued: tuple[tuple[str, str, int], ...]  # (buyer id, lease id, price)


def reconcile_balance(found: WalletLeases) -> Call[BalanceReconciled]:
    wallet = found.wallet
    return Call(
        "reconcile_balance",
        (
            found.balance_key,
            *(keys.leases(b) for b, _ in found.buyers),
            *(keys.lease(b, i) for b, ids in found.buyers for i in ids),
            *(keys.lease(b, lease_id) for b, lease_id, _ in found.queued),
        ),
        (
            len(found.buyers),
            wallet.account,
            wallet.wallet_minor,
            wallet.version,
            *(len(ids) for _, ids in found.buyers),
            *(i for _, ids in found.buyers for i in ids),
            *(price for _, _, price in found.queued),
        ),
        lambda raw: BalanceReconciled(str(raw[0]), *(int(x) for x in raw[1:])),
    )


def adjust_counter(counter: str, delta: int, expire_at: int) -> Call[int]:
    return Call("adjust_counter", (counter,), (delta, expire_at), int)


def take_batch(backlog: Backlog, job_id: str, size: int) -> Call[list[str]]:
    return Call("take_batch", backlog.keys(job_id), (size,), list)


def payment_gate(
    ref: PaymentRef,
    fingerprint: str,
    token: str,
    claim_ttl_ms: int,
    *,
    body_sha256: str,
    audit_row: str | None,
    scheduled_ttl_ms: int,
    audited_ttl_ms: int,
) -> Call[GateReply]:
    """With `audit_row` (JSON, its opening brace left out) the row of a webhook that changes
    nothing is queued by the script itself (the queue must live on this Redis, in one slot),
    and the drain's scheduled flag set for `scheduled_ttl_ms`; without it the reply says
    whether the caller must queue it. Either way once per body and verdict within
    `audited_ttl_ms`."""
    head = (ref.marker, ref.claim, ref.audited)
    if audit_row is None:
        script_keys: tuple[str, ...] = head
        args: tuple[Arg, ...] = (fingerprint, token, claim_ttl_ms, "", 0, body_sha256, audited_ttl_ms)
    else:
        script_keys = (*head, keys.WEBHOOK_CALLS_PENDING, keys.SETTLE_SCHEDULED)
        args = (fingerprint, token, claim_ttl_ms, audit_row, scheduled_ttl_ms, body_sha256, audited_ttl_ms)
    return Call(
        "payment_gate",
        script_keys,
        args,
        lambda raw: GateReply(GateVerdict(raw[0]), bool(raw[1]), bool(raw[2])),
    )


def finish_payment(ref: PaymentRef, token: str, fingerprint: str | None, marker_ttl_s: int) -> Call[None]:
    return Call("finish_payment", (ref.marker, ref.claim), (fingerprint or "", marker_ttl_s, token), lambda _raw: None)


def take_token(publisher_id: str, per_second: int, burst: int) -> Call[tuple[bool, int]]:
    """(taken, the whole tokens left when taken, else the ms until the next token)."""
    return Call(
        "take_token", (keys.rate_bucket(publisher_id),), (per_second, burst), lambda raw: (raw[0] == 1, int(raw[1]))
    )


def take_precheck(
    posted: Sequence[str], prechecks: Sequence[str], *, per_lead: int, daily_floor: int, ttl_s: int
) -> Call[Prechecked]:
    """`posted` and `prechecks`: the publisher's hourly counters of the window, this hour first."""

    def read(raw: list[Any]) -> Prechecked:
        taken, value, quota = (int(x) for x in raw)
        return Prechecked(True, value, quota) if taken else Prechecked(False, 0, quota, wait_hours=value)

    return Call("take_precheck", (*posted, *prechecks), (per_lead, daily_floor, ttl_s), read)


NAMES = (
    "adjust_counter",
    "answer_lead",
    "claim_lead",
    "claim_or_get",
    "extend_lease",
    "finish_lease",
    "finish_payment",
    "give_back",
    "payment_gate",
    "rebuild_counters",
    "reconcile_balance",
    "release_claim",
    "reserve_lease",
    "restore_answer",
    "snapshot_caps",
    "sync_balance",
    "take_batch",
    "take_precheck",
    "take_token",
)
