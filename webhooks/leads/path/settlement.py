"""Handing a routed lead to the ledger: the item, its queue in Redis, and what is unsettled.

Settlements go to one Redis list that a single RQ job drains in batches, so intake at
hundreds of leads a second costs one LPUSH each, not one forked job each.

If that Redis loses its data, the settlements queued in it are gone with it. Each web
process therefore keeps a journal of what it pushed in the last minutes and pushes it again
when the Redis epoch changes (those the ledger does not hold yet); the ledger's unique keys
make any repeat harmless, and the counter rebuild (rebuild.py) waits long enough to count
them.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from rq import Queue

from webhooks.caps import leases
from webhooks.formats.consumer import DEFAULT_SUPPRESSION_KEY
from webhooks.leads.accounting.item import SaleLine, SettlementItem
from webhooks.leads.path import answers
from webhooks.leads.path.context import LeadContext
from webhooks.leads.posting.delivery import ACCEPTED
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.live import claims, erasures, keys
from webhooks.storage.live.batch import Batch, Client, Pending
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.live.scripts import BreakerRule, LeadKey, Lease
from webhooks.storage.live.settle_queue import push
from webhooks.storage.states import TEST_STATUSES, LeadStatus

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from webhooks.leads.path.routing import Outcome
    from webhooks.storage.live.redis import Store

log = logging.getLogger(__name__)

CENTS = Decimal("0.01")
LEDGER_CHECK_S = 2.0  # after a loss, how long a journal asks the ledger what it has already


def percent_payout(price: Decimal, pct: Decimal) -> Decimal:
    return (price * pct / 100).quantize(CENTS, rounding=ROUND_HALF_UP)


def payout(publisher: PublisherRule, price: Decimal) -> Decimal:
    """What the publisher earns for a lead sold at `price` under its payout rule now: a fixed
    amount, or its percentage of the price. The ledger keeps it per sale (column `commission`),
    so a later change of the rule applies to later sales only, and a return takes back this one."""
    if publisher.payout_fixed is not None:
        return publisher.payout_fixed
    return percent_payout(price, publisher.payout_pct)


def make_item(
    *,
    publisher: PublisherRule,
    lead_id: str,
    outcome: Outcome,
    payload: str,
    received_at: datetime,
    request_id: str | None,
    test: bool = False,
) -> SettlementItem:
    """The settlement of a routed lead. A test lead's records what it would have become
    (status test_sold / test_unsold, the buyer and price that would have bought it) and
    earns nothing: the ledger counts no test lead as a sale."""
    item = SettlementItem(
        publisher_id=publisher.id,
        lead_id=lead_id,
        status=outcome.status,
        buyer_id=outcome.buyer_id,
        price=None,
        payout=None,
        attempts=tuple(outcome.attempts),
        skipped=tuple(outcome.skipped),
        consent=tuple(outcome.consent),
        payload=payload,
        received_at=received_at.isoformat(),
        request_id=request_id,
    )
    if test:  # what it would have become, with nothing sold, earned or attempted
        sold = outcome.status == LeadStatus.SOLD and outcome.price is not None
        return replace(
            item,
            status=LeadStatus.TEST_SOLD if sold else LeadStatus.TEST_UNSOLD,
            price=f"{outcome.price:.2f}" if sold and outcome.price is not None else None,
            attempts=(),
        )
    if outcome.status == LeadStatus.SOLD:  # the sale's fields
        price, sold_at, lease = outcome.price, outcome.sold_at, outcome.lease
        assert price is not None and sold_at is not None and lease is not None  # a sale has all three
        return replace(
            item,
            price=f"{price:.2f}",
            payout=f"{payout(publisher, price):.2f}",
            sold_at=sold_at.isoformat(),
            lease=(lease.buyer_id, lease.lease_id),
            reserved_us=lease.reserved_us,
            charge=None if outcome.charge is None else (outcome.charge.account, outcome.charge.minor),
            more_sales=tuple(
                SaleLine(
                    buyer_id=sold.buyer_id,
                    price=f"{sold.price:.2f}",
                    payout=f"{payout(publisher, sold.price):.2f}",
                    sold_at=sold_at.isoformat(),
                    lease=(sold.lease.buyer_id, sold.lease.lease_id),
                    reserved_us=sold.lease.reserved_us,
                    charge=None if sold.charge is None else (sold.charge.account, sold.charge.minor),
                )
                for sold in outcome.more
            ),
        )
    return item


def answer_of(item: SettlementItem) -> dict[str, Any]:
    """The publisher's answer for a settlement item (docs/api.md "POST /v1/leads"); a test lead's
    says what it would have become, marked `"test": true`."""
    answer: dict[str, Any] = {
        "lead_id": item.lead_id,
        "status": item.status,
        "buyer_id": item.buyer_id,
        "price": item.price,
        "attempts": [dict(a) for a in item.attempts],
    }
    if item.status == LeadStatus.SOLD:  # its first sale is the item's own fields: no SaleLine made
        first = {"buyer_id": item.buyer_id, "price": item.price}
        answer["sales"] = [first, *({"buyer_id": s.buyer_id, "price": s.price} for s in item.more_sales)]
    if item.status in TEST_STATUSES:
        answer.update(status=TEST_STATUSES[item.status], test=True)
    return answer


@dataclass(slots=True)
class _Entry:
    """One settlement a web process pushed: what re-pushing it needs, at its smallest."""

    at: float  # time.monotonic() when pushed
    head: str  # the settlement's JSON, its payload left out
    payload: bytes | None  # the lead's body, zlib-compressed when large; None once dropped
    answer: str  # what the publisher was given, as its claim remembers it (leads/path/answers.py)
    lead: tuple[str, str]  # (publisher_id, lead_id)

    @property
    def size(self) -> int:
        return len(self.head) + len(self.payload or b"") + len(self.answer) + ENTRY_OVERHEAD

    def raw(self) -> str:
        """The settlement as it was pushed (an empty payload once the budget dropped it)."""
        item = SettlementItem.from_json(self.head)
        if self.payload is None:
            return replace(item, payload="", payload_dropped=True).to_json()
        return replace(item, payload=_unpack(self.payload)).to_json()


ENTRY_OVERHEAD = 400  # bytes an entry costs besides its strings (objects, deque slot)
COMPRESS_OVER = 2048  # payloads longer than this are kept zlib-compressed
_PACKED = b"z"  # first byte of a compressed payload; a plain one starts with "p"


def _pack(payload: str) -> bytes:
    raw = payload.encode()
    return _PACKED + zlib.compress(raw, 1) if len(raw) > COMPRESS_OVER else b"p" + raw


def _unpack(packed: bytes) -> str:
    return (zlib.decompress(packed[1:]) if packed[:1] == _PACKED else packed[1:]).decode()


class Journal:
    """What this process pushed lately, to push again if the settlement Redis loses it.

    Its memory is bounded (`max_bytes`): past it, the oldest entries give up their lead bodies
    first (re-pushed after a loss they settle with an empty payload, flagged), then whole
    entries go; a publisher sending large leads cannot grow a web process without limit."""

    CHECK_INTERVAL_S = 0.5  # well under rebuild's wait, so a rebuild counts the re-pushes

    def __init__(
        self,
        queue_redis: Client,
        queue: Queue,
        keep_s: float = 600,
        *,
        max_items: int = 100_000,
        claims: Store | None = None,
        replay_ttl_s: int = 7 * 24 * 3600,
        max_bytes: int = 64 * 1024 * 1024,
    ):
        self.queue_redis, self.queue, self.keep_s = queue_redis, queue, keep_s
        self.claims, self.replay_ttl_s = claims, replay_ttl_s
        self.entries: collections.deque[_Entry] = collections.deque()
        self.max_items, self.max_bytes = max_items, max_bytes
        self.bytes = 0  # what the entries hold now (see _Entry.size)
        self._next_payload = 0  # entries before this index have given up their payload
        self.epoch: str | None = None
        self._unrestored: list[tuple[LeadKey, str]] = []  # (lead, answer) to put back after a loss
        self._restored_for: str | None = None  # the epoch whose loss the answers were put back for
        self._watcher: threading.Thread | None = None
        self.process = uuid.uuid4().hex  # this journal's name in the erasure feed
        self.erasures_read = erasures.START  # the last erasure whose body is dropped here

    def push(self, item: SettlementItem, batch: Batch | None = None, answer: str | None = None) -> None:
        """Queue `item` for the ledger (see `push`) and remember it with the answer its
        publisher was given, in the form its claim keeps (`answer`, leads/path/answers.py)."""
        raw = item.to_json()
        entry = _Entry(
            at=time.monotonic(),
            head=replace(item, payload="").to_json(),
            payload=_pack(item.payload),
            answer=answer or answers.remember(answer_of(item)),
            lead=(item.publisher_id, item.lead_id),
        )
        self._remember(entry)
        b = Batch(self.queue_redis) if batch is None else batch
        learned = self._learn_epoch(b) if self.epoch is None else None
        push(self.queue_redis, self.queue, [raw], b, request_id=item.request_id)
        if learned is not None and self.epoch is None:
            self.epoch = learned.value
        self.start_watching()

    def _learn_epoch(self, b: Batch) -> Pending[str | None]:
        """The queue Redis's epoch, read in the round trip of this process's first push: the
        watcher's first check may come after a loss that took that push with it, and would
        then take the new epoch for the one it pushed under, and never put the answers back."""
        b.set(keys.EPOCH, uuid.uuid4().hex, nx=True)
        return b.get(keys.EPOCH)

    def _remember(self, entry: _Entry) -> None:
        self.entries.append(entry)
        self.bytes += entry.size
        while len(self.entries) > self.max_items:
            self._forget_oldest()
        while self.bytes > self.max_bytes and self._next_payload < len(self.entries):
            oldest = self.entries[self._next_payload]
            self.bytes -= len(oldest.payload or b"")
            oldest.payload = None
            self._next_payload += 1
        while self.bytes > self.max_bytes and len(self.entries) > 1:
            self._forget_oldest()

    def forget_bodies(self, leads: Collection[tuple[str, str]]) -> None:
        """Drop the bodies of `leads` (publisher_id, lead_id), whose personal data was erased: a
        settlement pushed again after a loss would only find its ledger row there already."""
        for entry in list(self.entries):  # a copy: a push may append meanwhile (another thread)
            if entry.lead in leads and entry.payload is not None:
                self.bytes -= len(entry.payload)
                entry.payload = _pack("")
                self.bytes += len(entry.payload)

    def forget_erased(self) -> None:
        """Drop the bodies of the leads erased by any process since the last look (the erasure
        feed, storage/live/erasures.py), then say so: an erasure waits for every live journal."""
        read = erasures.read(self.queue_redis, process=self.process, after=self.erasures_read)
        if read.last != self.erasures_read:
            self.forget_bodies(read.leads)
            self.erasures_read = read.last
            erasures.acknowledge(self.queue_redis, process=self.process, last=read.last)

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = self._next_payload = 0

    def _forget_oldest(self) -> None:
        self.bytes -= self.entries.popleft().size
        self._next_payload = max(0, self._next_payload - 1)

    def check_epoch(self) -> int:
        """Push the journal again if Redis lost its data since we last looked; return how many.
        The answers the publishers were given are put back first (a retry replays them), then
        the settlements the ledger does not hold are pushed again; the new epoch is remembered
        only once every one is (a failure part-way pushes them all again on the next check: the
        ledger's unique keys make the repeats harmless). Part
        of the recovery from a Redis data loss: see docs/architecture.md "When Redis loses its data".
        Erased bodies are dropped first, so none is pushed again."""
        self.forget_erased()
        self._restore_answers()
        fresh = uuid.uuid4().hex
        current: str | None
        if self.queue_redis.set(keys.EPOCH, fresh, nx=True):
            current = fresh
        else:
            current = cast("str | None", self.queue_redis.get(keys.EPOCH))  # decoded replies
        previous = self.epoch
        cutoff = time.monotonic() - self.keep_s
        while self.entries and self.entries[0].at < cutoff:
            self._forget_oldest()
        if previous is None or previous == current or not self.entries:
            self.epoch = current
            return 0
        entries = list(self.entries)
        log.info("settlement Redis lost its data: %d recent settlements to check and push again", len(entries))
        if self.claims is not None and current != self._restored_for:
            # The answers went with the data: without them a publisher's retry would route
            # its lead again, to another buyer perhaps, while the ledger keeps the first sale.
            # Put back first (one round trip a thousand), before the ledger is asked what it
            # holds (up to LEDGER_CHECK_S, longer when its pool is busy): a retry in between
            # would find no answer, and route the lead once a claim's life has passed.
            self._unrestored = [(LeadKey(*e.lead), e.answer) for e in entries]
            self._restored_for = current
            self._restore_answers()
        settled = _settled(entries)
        again = [e.raw() for e in entries if e.lead not in settled]
        for i in range(0, len(again), 1000):
            push(self.queue_redis, self.queue, again[i : i + 1000])
        self.epoch = current
        log.warning(
            "settlement Redis lost its data: pushed %d recent settlements again (%d of %d journaled "
            "were in the ledger already)",
            len(again),
            len(settled),
            len(entries),
        )
        return len(again)

    def _restore_answers(self) -> None:
        """Put back the answers still to restore; what fails (the claims' Redis not back yet)
        is tried again on the next check."""
        while self._unrestored:
            chunk = self._unrestored[:1000]
            assert self.claims is not None  # only a journal with claims has answers to restore
            try:
                self.claims.restore_answers(chunk, self.replay_ttl_s)
            except Exception as exc:
                log.warning("%d answers not put back yet: %s", len(self._unrestored), exc)
                return
            del self._unrestored[:1000]

    def start_watching(self) -> None:
        """Watch the epoch from a thread of this process; started again if it has ended."""
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self._watch, daemon=True, name="journal")
            self._watcher.start()

    def _watch(self) -> None:
        failures = 0
        while True:
            try:
                self.check_epoch()
                failures = 0
            except Exception as exc:  # Redis down: try again next round
                failures += 1
                # quiet while Redis restarts; said once it has lasted a minute (checks are 0.5 s apart)
                level = logging.WARNING if failures == 120 or failures % 1200 == 0 else logging.DEBUG
                log.log(level, "epoch check failed %d time(s) in a row: %r", failures, exc)
            time.sleep(self.CHECK_INTERVAL_S)


def _settled(entries: list[_Entry], budget_s: float = LEDGER_CHECK_S) -> set[tuple[str, str]]:
    """The journal entries' leads the ledger has already: not pushed again after a loss (tens
    of thousands a process, each drained again by the worker and read by every counter
    rebuild). The ledger is asked for `budget_s` at most (the counter rebuilds wait for the
    journals, rebuild.SETTLE_MARGIN_S): the entries it has not answered for by then, or
    all of them when it cannot be asked, are pushed again."""
    from webhooks.caps.sales import settled_of
    from webhooks.storage.records.db import db

    leads = [e.lead for e in entries]
    found: set[tuple[str, str]] = set()
    until = time.monotonic() + budget_s
    try:
        with db.connection_context():
            for i in range(0, len(leads), 2000):
                if time.monotonic() > until:
                    log.warning(
                        "the ledger check of the journal ran out of time: %d entries pushed again unchecked",
                        len(leads) - i,
                    )
                    break
                found |= settled_of(leads[i : i + 2000])
    except Exception as exc:  # any failure: push them all, the ledger's unique keys drop repeats
        log.warning("the ledger could not be asked (%s): every journaled settlement is pushed again", exc)
        return set()
    return found


@dataclass(frozen=True)
class Settlement:
    """How a process ends its leads: the stores, how it queues a settlement (`queue_item(item,
    batch, answer)`: a web process's journal, or the queue itself), the breaker rule a sale
    feeds and how long an answer is remembered for replays."""

    store: Store
    queue_redis: Store
    queue_item: Callable[[SettlementItem, Batch | None, str], None]
    breaker: BreakerRule
    replay_ttl_s: int
    lookup_key: bytes = DEFAULT_SUPPRESSION_KEY.encode()  # SUPPRESSION_KEY: the ledger's lookup digests


def end_lead(s: Settlement, token: str, outcome: Outcome, item: SettlementItem, keep_claim: bool = False) -> bool:
    """End a routed lead: confirm its lease (a sale), queue the settlement, and remember the
    answer (leads/path/answers.py) for the publisher's replays and forget the attempt note (if
    the claim still holds `token`). The one end of a lead, for a request
    (leads/path/intake.py) and for the abandoned-lead sweep (leads/path/recovery.py). With
    `keep_claim` (it is not the caller's any more) the claim and the note are left to the
    request that holds them. Redis unreachable: the buyer has the lead, the answer stands,
    and the settlement is written to the ledger directly (an unconfirmed lease just expires;
    its slot stays counted, as the sale is).

    On one Redis it is one round trip, a transaction: a process killed while sending it (the
    lease's script alone is about 6 KB) leaves either all of it done or none of it. With none
    done, the attempt note stays and the retry (or the sweep) offers the lead to the same
    buyer again. With the queue on a Redis of its own (RQ_REDIS_URL) no transaction spans
    both, so a sale goes in three steps, in the order that leaves no answer without its
    settlement: the lease confirmed, the settlement queued, then the answer. A process killed
    between them leaves the attempt note; the retry finds the lease confirmed, or gone with
    its settlement into the ledger (recovery.reoffer asks the ledger), and answers "sold".
    An unsold lead is answered first: queued first, a retry could route it again and sell
    it, and the ledger would keep the queued "unsold".

    Returns whether the settlement is queued or in the ledger: False when neither the queue
    nor the database could take it (it is logged, and for a sale no answer is kept)."""
    answer = answers.remember(answer_of(item))
    lead = None if keep_claim else LeadKey(item.publisher_id, item.lead_id)
    finish = outcome.leases  # a shared lead's every sale
    try:
        if s.queue_redis is s.store:
            batch = s.store.batch(atomic=True)
            for lease in finish:
                leases.finish_in(batch, lease, ACCEPTED, s.breaker)
            if lead is not None:
                batch.answer_lead(lead, token, answer, s.replay_ttl_s)
            s.queue_item(item, batch, answer)  # sends the batch
            return True
        if outcome.lease is not None:
            return _end_sale_apart(s, token, finish, item, answer=answer, lead=lead)
        if lead is not None:
            s.store.answer_lead(lead, token, answer, s.replay_ttl_s)
        s.queue_item(item, None, answer)
        return True
    except REDIS_DOWN:
        return settle_directly(item, s.lookup_key)


def _end_sale_apart(
    s: Settlement, token: str, finish: list[Lease], item: SettlementItem, *, answer: str, lead: LeadKey | None
) -> bool:
    """A sale's end with its queue on a Redis of its own, in end_lead's order: the leases
    confirmed (`finish`: those that need it), the settlement queued (else written to the
    ledger), then the answer (`lead`, unless the claim is not ours)."""
    if finish:
        with s.store.batch() as b:
            for lease in finish:
                leases.finish_in(b, lease, ACCEPTED, s.breaker)
    try:
        s.queue_item(item, None, answer)
    except REDIS_DOWN:
        if not settle_directly(item, s.lookup_key):
            return False  # in neither: no answer either, the note stays for the retry
    if lead is not None:
        with contextlib.suppress(*REDIS_DOWN):  # settled: the note stays, the retry answers
            s.store.answer_lead(lead, token, answer, s.replay_ttl_s)
    return True


class Ended(NamedTuple):
    """How `end_in_time` left a lead."""

    ended: bool  # by this call: its settlement is queued or in the ledger
    holder: str | None = None  # what the claim holds for another request that took it meanwhile


def end_in_time(s: Settlement, ctx: LeadContext, outcome: Outcome, item: SettlementItem) -> Ended:
    """`end_lead`, for a request and for the sweep alike. Near or past the claim's end (a stalled
    process: the claim may be another request's now) the lead ends without touching the
    claim, and the answer is written token-checked: a sale's after its settlement is queued
    (a sale stands whoever holds the claim: the buyer has the lead), anything else's before,
    and when another request holds the claim by then, that is dropped and what the claim
    holds is returned (`holder`), for the caller to answer with. Not `ended` when an unsold
    lead's claim was another's (`holder` set), or when neither the queue nor the ledger could
    take the settlement (it is logged "settlement LOST")."""
    if time.monotonic() <= ctx.deadline - claims.LATE_S:
        return Ended(end_lead(s, ctx.token, outcome, item))
    sold = outcome.lease is not None
    if sold and not end_lead(s, ctx.token, outcome, item, keep_claim=True):
        return Ended(False)  # its settlement is in neither the queue nor the ledger: no answer kept
    try:
        holder = s.store.answer_lead(ctx.key, ctx.token, answers.remember(answer_of(item)), s.replay_ttl_s).held
    except REDIS_DOWN:
        holder = None  # cannot tell: end as usual (the settlement goes to the database)
    if holder is not None:
        log.error(
            "lead %s:%s: the claim expired while it was routed (a stalled process); outcome %s%s",
            ctx.publisher.id,
            ctx.lead_id,
            outcome.status,
            " to " + str(outcome.buyer_id) if outcome.buyer_id else "",
        )
        if not sold:
            return Ended(False, holder)
    if not sold:
        return Ended(end_lead(s, ctx.token, outcome, item, keep_claim=True))
    return Ended(True)


def settle_directly(item: SettlementItem, lookup_key: bytes) -> bool:
    """Write one settlement synchronously: the fallback when its queue is unreachable.
    Whether it was written."""
    from webhooks.leads.accounting.ledger import settle
    from webhooks.storage.records.db import UNAVAILABLE_ERRORS, db

    try:
        with db.connection_context():
            settle([item], lookup_key=lookup_key)
        log.warning("settlement queue unreachable: lead %s:%s written directly", item.publisher_id, item.lead_id)
        return True
    except UNAVAILABLE_ERRORS:
        log.error("settlement LOST from queue and database, recover it from this line: %s", item.to_json())
        return False
