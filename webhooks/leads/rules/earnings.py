"""What a lead earns from each buyer, and the order `epl` routing offers a lead in
(docs/leads.md "Earnings-per-lead routing").

Per publisher and UTC day, Redis keeps each buyer's offers, accepted offers, returned sales
and net earnings (the prices of its sales less those of its returns, in cents): a hash per day
(keys.earnings), counted by the settlement worker as it writes the ledger and by a return as
it commits, rebuilt from the ledger after a data loss (`rebuild`). A lead of an `epl`
publisher reads its publisher's window of days in the round trip that claims it (same hash tag:
no round trip more, no database read).

The order is Thompson sampling over earnings per offer: for each buyer a draw of its accept
rate, Beta(accepted + 1, offers - accepted + 1), and of the share of its sales kept,
Beta(kept + 1, returned + 1), times its price now (a ping/post buyer's bid: its accept rate
is then how often its won pings became accepted posts). A buyer offered often is ranked by what
it earned, almost always; one offered rarely draws widely, and so is offered often enough to
be judged; none is ever shut out. No parameter needs tuning; EPL_PRIOR_OFFERS sets how many
offers' worth of doubt a new buyer starts with."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, cast

from webhooks.formats.validate import cents
from webhooks.storage.live import keys
from webhooks.storage.live.batch import Batch, Client, Pending

WINDOW_DAYS_MAX = 90
TTL_S = (WINDOW_DAYS_MAX + 2) * 86_400  # a day's counts outlive the longest window


@dataclass(frozen=True)
class Tally:
    """One buyer's figures for one publisher over a window (weighed by age: `weigh`, floats)."""

    offers: float = 0
    accepted: float = 0
    returned: float = 0
    earned_cents: float = 0

    def scaled(self, w: float) -> Tally:
        return Tally(self.offers * w, self.accepted * w, self.returned * w, self.earned_cents * w)

    @property
    def epl(self) -> Decimal:
        """Its earnings per offer (0 before any offer)."""
        if not self.offers:
            return Decimal(0)
        return (Decimal(str(self.earned_cents)) / 100 / Decimal(str(self.offers))).quantize(Decimal("0.01"))

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.offers + other.offers,
            self.accepted + other.accepted,
            self.returned + other.returned,
            self.earned_cents + other.earned_cents,
        )


def day_of(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y%m%d")


def window(now: datetime, days: int) -> list[str]:
    """The UTC days of a window of `days` ending today, oldest first."""
    return [day_of(now - timedelta(days=i)) for i in range(days - 1, -1, -1)]


def read_in(batch: Batch, publisher_id: str, now: datetime, days: int) -> tuple[Pending[Any], list[Pending[Any]]]:
    """Queue in `batch` the read of a publisher's earnings over `days` (its ready mark, then each
    day's hash): one command a day, on the publisher's hash tag."""
    ready = batch.exists(keys.earnings_ready(publisher_id))
    return ready, [batch.hgetall(keys.earnings(publisher_id, d)) for d in window(now, days)]


def tallies(days: Iterable[Mapping[Any, Any]]) -> dict[str, Tally]:
    """Each buyer's tally over the days read (HGETALL replies, text or bytes)."""
    sums: dict[str, list[int]] = {}
    for fields in days:
        for name, value in fields.items():
            field = name.decode() if isinstance(name, bytes) else str(name)
            buyer_id, _, kind = field.rpartition(":")
            if kind not in _KINDS or not buyer_id:
                continue
            sums.setdefault(buyer_id, [0, 0, 0, 0])[_KINDS[kind]] += int(value)
    return {b: Tally(*v) for b, v in sums.items()}


_KINDS = {"o": 0, "a": 1, "r": 2, "e": 3}


def weigh(days: Sequence[Mapping[str, Tally]], half_life_days: float) -> dict[str, Tally]:
    """Each buyer's tally over `days` (oldest first, today last), a day `age` days old counting
    0.5 ** (age / half_life_days) (today in full; 0: every day in full). What the ranking
    reads: a buyer's change shows within about a half-life, however many days the window keeps
    (docs/leads.md "Earnings-per-lead routing")."""
    out: dict[str, Tally] = {}
    last = len(days) - 1
    for i, day in enumerate(days):
        w = 0.5 ** ((last - i) / half_life_days) if half_life_days > 0 else 1.0
        for buyer_id, t in day.items():
            out[buyer_id] = out.get(buyer_id, EMPTY) + (t if w == 1.0 else t.scaled(w))
    return out


def days_read(replies: Iterable[Mapping[Any, Any]]) -> list[dict[str, Tally]]:
    """Each day's tallies, from the HGETALL replies of `read_in` (oldest first)."""
    return [tallies([fields]) for fields in replies]


def score(price: Decimal, tally: Tally, rng: random.Random, prior_offers: int = 2) -> float:
    """One draw of what an offer at `price` earns from a buyer with `tally` (the module's doc)."""
    half = prior_offers / 2
    accepted = min(tally.accepted, tally.offers)
    kept = max(0, accepted - tally.returned)
    accept = rng.betavariate(accepted + half, tally.offers - accepted + half)
    keep = rng.betavariate(kept + half, min(tally.returned, accepted) + half)
    return float(price) * accept * keep


def rank(
    offers: Sequence[Any],
    tally_of: Mapping[str, Tally],
    rng: random.Random | None = None,
    prior_offers: int = 2,
    key: Any = None,
) -> list[Any]:
    """`offers` in the order of one draw each of what it earns (`score`), highest first; a tie
    by priority, then id. `key(offer)` gives (buyer_id, price, priority) (default: its
    `.buyer.id`, `.price`, `.buyer.priority`)."""
    rng = rng or _rng
    of = key or (lambda o: (o.buyer.id, o.price, o.buyer.priority))
    drawn = []
    for o in offers:
        buyer_id, price, priority = of(o)
        drawn.append((-score(price, tally_of.get(buyer_id, EMPTY), rng, prior_offers), priority, buyer_id, o))
    drawn.sort(key=lambda d: d[:3])
    return [d[3] for d in drawn]


EMPTY = Tally()
_rng = random.Random()


@dataclass(frozen=True)
class Count:
    """One change to a buyer's figures for a publisher and day (`count`)."""

    publisher_id: str
    buyer_id: str
    day: str
    offers: int = 0
    accepted: int = 0
    returned: int = 0
    earned_cents: int = 0


def count(r: Client, changes: Sequence[Count]) -> None:
    """Add `changes` to the days' hashes, one round trip (each key's expiry set again)."""
    if not changes:
        return
    pipe = r.pipeline(transaction=False)
    touched = set()
    for c in changes:
        key = keys.earnings(c.publisher_id, c.day)
        for kind, amount in (("o", c.offers), ("a", c.accepted), ("r", c.returned), ("e", c.earned_cents)):
            if amount:
                pipe.hincrby(key, f"{c.buyer_id}:{kind}", amount)
        touched.add(key)
    for key in touched:
        pipe.expire(key, TTL_S)
    pipe.execute()


# The attempts that offered a lead to a buyer (a circuit open or a lead that could not be made
# into a request offered it nothing)
OFFERED = frozenset({"accepted", "rejected", "error", "timeout", "unknown"})


def settled(
    publisher_id: str, received_at: str, attempts: Iterable[Mapping[str, Any]], sales: Iterable[tuple[str, str, str]]
) -> list[Count]:
    """What a lead newly in the ledger adds: each attempt an offer (its yes an accepted offer) in
    the day it was received, each sale `(buyer_id, price, sold_at)` its price in its sale's day."""
    day = day_of(datetime.fromisoformat(received_at))
    out = [
        Count(publisher_id, str(a["buyer_id"]), day, offers=1, accepted=int(a["outcome"] == "accepted"))
        for a in attempts
        if a.get("outcome") in OFFERED
    ]
    out += [
        Count(publisher_id, buyer_id, day_of(datetime.fromisoformat(sold_at)), earned_cents=cents(Decimal(price)))
        for buyer_id, price, sold_at in sales
    ]
    return out


def returned(publisher_id: str, buyer_id: str, price: Decimal, sold_at: datetime) -> Count:
    """A sale returned: one return, its price out of the earnings of its sale's day."""
    at = sold_at if sold_at.tzinfo else sold_at.replace(tzinfo=timezone.utc)
    return Count(publisher_id, buyer_id, day_of(at), returned=1, earned_cents=-cents(price))


READ_EVERY_S = 1.0  # how old a process's read of a publisher's figures may be before the next


@dataclass
class Recent:
    """A process's last read of each `epl` publisher's figures (ready, weighed tallies), so that
    a lead's order can be drawn before its claim and its first offer reserved in the claim's
    round trip, as every other mode's is; read again, in a claim's round trip, once READ_EVERY_S
    old (docs/leads.md "Earnings-per-lead routing")."""

    every_s: float = READ_EVERY_S
    seen: dict[str, tuple[float, bool, dict[str, Tally]]] = field(default_factory=dict)

    def get(self, publisher_id: str) -> tuple[bool, dict[str, Tally]] | None:
        """(ready, tallies) as last read; None before the first read."""
        found = self.seen.get(publisher_id)
        return None if found is None else (found[1], found[2])

    def due(self, publisher_id: str, now: float) -> bool:
        """Whether a lead's claim should read the publisher's figures: none read, READ_EVERY_S
        old, or not ready when read (each lead looks again until the rebuild is done)."""
        found = self.seen.get(publisher_id)
        return found is None or not found[1] or now - found[0] >= self.every_s

    def put(self, publisher_id: str, ready: bool, tallies: dict[str, Tally], now: float) -> None:
        if len(self.seen) > 10_000:  # publishers come and go: never without bound
            self.seen.clear()
        self.seen[publisher_id] = (now, ready, tallies)


REBUILD_LOCK_MS = 60_000
RETRY_AFTER_S = 2  # what a lead waiting for a rebuild is told (it takes well under a second)


def from_ledger(publisher_id: str, now: datetime, days: int) -> list[Count]:
    """A publisher's figures over `days` as the ledger holds them: every attempt and sale of its
    leads received since the window's first day (a returned sale: its return too)."""
    from webhooks.storage.records.models import Lead, LeadAttempt, Sale

    since = datetime.strptime(window(now, days)[0], "%Y%m%d")  # naive UTC, as the ledger keeps times
    out: list[Count] = []
    attempts = (
        LeadAttempt.select(LeadAttempt.buyer_id, LeadAttempt.outcome, Lead.received_at)
        .join(Lead, on=(Lead.publisher_id == LeadAttempt.publisher_id) & (Lead.lead_id == LeadAttempt.lead_id))
        .where(LeadAttempt.publisher_id == publisher_id, Lead.received_at >= since)
        .tuples()
    )
    for buyer_id, outcome, received_at in cast("Iterable[tuple[str, str, datetime]]", attempts):  # .tuples()
        if outcome in OFFERED:
            day = received_at.strftime("%Y%m%d")
            out.append(Count(publisher_id, buyer_id, day, offers=1, accepted=int(outcome == "accepted")))
    sales = (
        Sale.select(Sale.buyer_id, Sale.price, Sale.sold_at, Sale.status)
        .where(Sale.publisher_id == publisher_id, Sale.sold_at >= since)
        .tuples()
    )
    for buyer_id, price, sold_at, status in cast("Iterable[tuple[str, Any, datetime, str]]", sales):
        day, amount = sold_at.strftime("%Y%m%d"), cents(Decimal(price))
        out.append(Count(publisher_id, buyer_id, day, earned_cents=amount))
        if status == "returned":
            out.append(Count(publisher_id, buyer_id, day, returned=1, earned_cents=-amount))
    return out


def rebuild(r: Client, publisher_id: str, now: datetime, days: int) -> int:
    """Set a publisher's figures over `days` from the ledger and mark them ready, in one
    transaction (the days' hashes replaced whole). Returns how many changes it counted. A
    settlement counted between the ledger's read and this write is counted once more: a
    statistic's drift of a few offers, which the next rebuild (after a loss) sets right."""
    from webhooks.storage.records.db import db

    with db.connection_context() if db.is_closed() else contextlib.nullcontext():  # a request's own, kept
        changes = from_ledger(publisher_id, now, days)
    sums: dict[tuple[str, str], list[int]] = {}
    for c in changes:
        v = sums.setdefault((c.day, c.buyer_id), [0, 0, 0, 0])
        v[0], v[1], v[2], v[3] = v[0] + c.offers, v[1] + c.accepted, v[2] + c.returned, v[3] + c.earned_cents
    pipe = r.pipeline(transaction=True)
    for d in window(now, WINDOW_DAYS_MAX):
        pipe.delete(keys.earnings(publisher_id, d))
    for (day, buyer_id), (o, a, ret, e) in sums.items():
        pipe.hset(
            keys.earnings(publisher_id, day),
            mapping={f"{buyer_id}:o": o, f"{buyer_id}:a": a, f"{buyer_id}:r": ret, f"{buyer_id}:e": e},
        )
        pipe.expire(keys.earnings(publisher_id, day), TTL_S)
    pipe.set(keys.earnings_ready(publisher_id), "1")
    pipe.execute()
    return len(changes)


def request_rebuild(r: Client, publisher_id: str, days: int) -> bool:
    """Rebuild a publisher's figures in a thread of this process unless one runs (a lock of
    REBUILD_LOCK_MS); True if started. Its leads wait meanwhile (503, RETRY_AFTER_S)."""
    import logging
    import threading

    if not r.set(keys.earnings_rebuild_lock(publisher_id), "1", nx=True, px=REBUILD_LOCK_MS):
        return False
    log = logging.getLogger(__name__)
    log.warning("earnings of publisher %s are not known (Redis lost data?): rebuilding from the ledger", publisher_id)

    def run() -> None:
        try:
            rebuild(r, publisher_id, datetime.now(timezone.utc), days)
        except Exception:
            log.exception("earnings rebuild of publisher %s failed: the next lead tries again", publisher_id)
        finally:
            r.delete(keys.earnings_rebuild_lock(publisher_id))

    threading.Thread(target=run, daemon=True, name=f"epl-rebuild-{publisher_id}").start()
    return True
