"""A lead whose routing died while a buyer held it: offered again to that buyer alone, on the same
reservation with the same Idempotency-Key, and settled as the buyer says; by the publisher's
retry (`reoffer`, from leads/path/intake.py) or, when none comes, by the abandoned-lead sweep
(`Sweeper`, run by workers/leads.py). docs/leads.md "Recovery"."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

from rq import Queue

from webhooks import metrics
from webhooks.caps import leases
from webhooks.leads.accounting.item import SettlementItem
from webhooks.leads.path import settlement
from webhooks.leads.path.context import LeadContext
from webhooks.leads.path.routing import Offer, Outcome, Sold, attempt_view, fan_out, idempotency_key
from webhooks.leads.posting.delivery import ACCEPTED, NOT_SENT, UNKNOWN, Deliverer
from webhooks.leads.posting.integration import RenderBudgetExceeded
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.live import claims, keys, settle_queue
from webhooks.storage.live.batch import Batch
from webhooks.storage.live.redis import Store
from webhooks.storage.live.scripts import BreakerRule, LeadKey, Lease
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Buyer
from webhooks.storage.states import ClaimOutcome, LeadStatus, LeaseState

if TYPE_CHECKING:
    from webhooks.config import Config

log = logging.getLogger(__name__)

SCAN = 500  # leases read per page
BUDGET_S = 25.0  # a sweep's time at most; the next run (a minute later) takes the rest


def reoffer(
    store: Store, deliverer: Deliverer, buyers: Iterable[BuyerRule], ctx: LeadContext, note: dict[str, Any]
) -> Outcome:
    """A lead whose routing died offered again to the buyers its attempt `note` names: one
    (`reoffer_one`), or a shared lead's several (`reoffer_shared`)."""
    if "shared" in note:
        return reoffer_shared(store, deliverer, buyers, ctx, note)
    return reoffer_one(store, deliverer, buyers, ctx, note)


def reoffer_one(
    store: Store, deliverer: Deliverer, buyers: Iterable[BuyerRule], ctx: LeadContext, note: dict[str, Any]
) -> Outcome:
    """Offer the lead again to the one buyer a dead request was offering it to (`note`, its
    attempt note), with the same Idempotency-Key, on the same reservation. Accepted: sold to
    that buyer. A reservation that is gone with its sale into the ledger (the dead request
    queued the settlement but never stored the answer: settlement.end_lead) is that sale,
    not offered again. Anything else, or a reservation gone otherwise: unsold, that attempt
    `unknown`, flagged for review; its slot stays taken until reconciliation. Never another
    buyer: the first may hold the lead already. Unavailable when the reservation is gone and
    the ledger cannot say whether it holds the sale."""
    buyer_id, publisher_id, lead_id = note["buyer_id"], ctx.publisher.id, ctx.lead_id
    lease = Lease(buyer_id, note["lease_id"], tuple(note["counters"]), dedupe=tuple(note.get("dedupe", ())))
    state, reserved_us = leases.take_over(store, lease, ctx.lease_ttl_ms)
    out = Outcome(attempts=list(note.get("attempts", [])))
    rule = next((b for b in buyers if b.id == buyer_id), None)  # switched off since: no
    bid = None if note.get("bid") is None else Decimal(note["bid"])
    outcome, ms, settled = UNKNOWN, 0, None
    if state is LeaseState.CONFIRMED:
        outcome = ACCEPTED  # its answer said yes before the process died: nothing to ask
    elif state is LeaseState.GONE:
        settled = _sale_in_ledger(publisher_id, lead_id, buyer_id)
        if settled is not None:
            outcome = ACCEPTED  # settled, and its lease released with it: nothing to ask
    elif rule is not None:
        offer = Offer(rule, Decimal(note["price"]), bid, note.get("ping"))
        try:
            body = offer.body(lead_id, publisher_id, ctx.lead, json.dumps(ctx.lead, separators=(",", ":")))
        except RenderBudgetExceeded:  # it could not be built before either: the buyer never had it
            outcome = NOT_SENT
        else:
            outcome, ms = deliverer.deliver(
                note["url"], body, idempotency_key(publisher_id, lead_id, buyer_id), rule.post
            )
    if outcome == ACCEPTED:
        if settled is None:
            out.attempts.append(attempt_view(buyer_id, bid, ACCEPTED, ms))
        else:
            out.attempts = list(settled["attempts"])  # the answer as the ledger keeps it
        out.status, out.buyer_id, out.price = LeadStatus.SOLD, buyer_id, Decimal(note["price"])
        out.sold_at = datetime.fromisoformat(note["at"])  # the windows the lease counted in
        out.charge = None if rule is None else rule.charge(Decimal(note["price"]))
        out.lease = Lease(
            buyer_id,
            lease.lease_id,
            lease.counters,
            reserved_us=reserved_us,
            dedupe=lease.dedupe,
            publisher_id=publisher_id,  # its settlement closes the buyer's circuit for the publisher
        )
        out.lease_finished = state is not LeaseState.HELD
        log.warning("lead %s:%s re-offered to %s after its routing died: accepted", publisher_id, lead_id, buyer_id)
    else:
        out.attempts.append(attempt_view(buyer_id, bid, UNKNOWN, ms))
        log.warning(
            "lead %s:%s left unsold for review: its routing died while offering it to %s, "
            "who did not confirm it (reservation %s, answer %s)",
            publisher_id,
            lead_id,
            buyer_id,
            state,
            outcome,
        )
    if settled is None:  # an attempt made now (the ledger's was counted when it was made)
        metrics.attempt(buyer_id, out.attempts[-1]["outcome"], ms or None)
    return out


def _sale_in_ledger(publisher_id: str, lead_id: str, buyer_id: str) -> dict[str, Any] | None:
    """The answer the ledger keeps for the lead when it holds it as sold to `buyer_id` (returned
    since counts: its publisher was told "sold"), else None; Unavailable when the ledger cannot
    be asked (answering unsold could contradict it)."""
    found = _settled_answer(publisher_id, lead_id)
    if found is None or buyer_id not in {s["buyer_id"] for s in found.get("sales", ())}:
        return None
    return found


def _settled_answer(publisher_id: str, lead_id: str) -> dict[str, Any] | None:
    """The answer the ledger keeps for a sold lead (None: it holds no sale of it)."""
    from webhooks.leads.accounting.ledger import ask_for_answer

    found = ask_for_answer(publisher_id, lead_id, "the ledger cannot say whether this lead was sold; retry shortly")
    return None if found is None or found["status"] != LeadStatus.SOLD else found


def reoffer_shared(
    store: Store, deliverer: Deliverer, buyers: Iterable[BuyerRule], ctx: LeadContext, note: dict[str, Any]
) -> Outcome:
    """`reoffer` for a shared lead whose routing died: every buyer its note names (the yeses
    so far and the wave that was out) is offered the lead again at once, with the same
    Idempotency-Key, on the same reservation, and the lead is sold to those that say yes
    (a confirmed lease: yes without asking). Nobody else is offered it: the retry sells to no
    one new. When a lease is gone, the ledger is asked: a dead request that settled the lead
    (its settlement queued, its answer lost) left its sales there, and they are the answer.
    A buyer that does not say yes again, or whose lease is gone otherwise, ends `unknown` with
    its slot kept, the lead flagged for review (sold to the others), as `reoffer_one` ends a
    lone buyer. Unavailable when the ledger cannot say."""
    publisher_id, lead_id = ctx.publisher.id, ctx.lead_id
    rules = {b.id: b for b in buyers}  # switched off since: not asked again
    out = Outcome(attempts=list(note.get("attempts", [])))
    held = [
        (h, Lease(h["buyer_id"], h["lease_id"], tuple(h["counters"]), dedupe=tuple(h.get("dedupe", ()))))
        for h in note["shared"]
    ]
    taken = [leases.take_over(store, lease, ctx.lease_ttl_ms) for _, lease in held]
    settled = _settled_answer(publisher_id, lead_id) if any(t[0] is LeaseState.GONE for t in taken) else None
    in_ledger = {s["buyer_id"] for s in settled.get("sales", ())} if settled is not None else set()
    lead_json = json.dumps(ctx.lead, separators=(",", ":"))
    asks: list[Any] = []
    for (h, _), (state, _) in zip(held, taken):
        rule = rules.get(h["buyer_id"])
        if state is not LeaseState.HELD or settled is not None or rule is None:
            asks.append(None)
            continue
        bid = None if h.get("bid") is None else Decimal(h["bid"])
        offer = Offer(rule, Decimal(h["price"]), bid, h.get("ping"))
        asks.append(functools.partial(_ask, deliverer, offer, ctx, lead_json))
    calls = [a for a in asks if a is not None]
    answered = iter(fan_out(calls, deliverer.timeout_s + 0.5))
    sales: list[Sold] = []
    for (h, lease), (state, reserved_us), ask in zip(held, taken, asks):
        buyer_id = h["buyer_id"]
        bid = None if h.get("bid") is None else Decimal(h["bid"])
        outcome, ms = (next(answered) or (UNKNOWN, 0)) if ask is not None else (UNKNOWN, 0)
        if state is LeaseState.CONFIRMED or buyer_id in in_ledger:
            outcome = ACCEPTED
        if settled is None:  # an attempt made now (the ledger's were counted when made)
            # anything but a yes ends `unknown`, its slot kept, as `reoffer_one` ends it: the
            # buyer was asked before the process died and may hold the lead
            out.attempts.append(attempt_view(buyer_id, bid, ACCEPTED if outcome == ACCEPTED else UNKNOWN, ms))
            metrics.attempt(buyer_id, out.attempts[-1]["outcome"], ms or None)
        if outcome != ACCEPTED:
            continue
        rule = rules.get(buyer_id)
        price = Decimal(h["price"])
        sales.append(
            Sold(
                buyer_id,
                price,
                Lease(
                    buyer_id,
                    lease.lease_id,
                    lease.counters,
                    reserved_us=reserved_us,
                    dedupe=lease.dedupe,
                    publisher_id=publisher_id,
                ),
                None if rule is None else rule.charge(price),
                lease_finished=state is not LeaseState.HELD,
            )
        )
    if settled is not None:
        out.attempts = list(settled["attempts"])  # the answer as the ledger keeps it
    if sales:
        out.sell(sales, datetime.fromisoformat(note["at"]))
    log.warning(
        "shared lead %s:%s re-offered to %d buyer(s) after its routing died: %d sale(s)",
        publisher_id,
        lead_id,
        len(held),
        len(sales),
    )
    return out


def _ask(deliverer: Deliverer, offer: Offer, ctx: LeadContext, lead_json: str) -> tuple[Any, int]:
    """One buyer of a shared lead asked again: (outcome, ms); NOT_SENT when the lead cannot be
    made into its request (it could not before either: the buyer never had it)."""
    try:
        body = offer.body(ctx.lead_id, ctx.publisher.id, ctx.lead, lead_json)
    except RenderBudgetExceeded:
        return NOT_SENT, 0
    key = idempotency_key(ctx.publisher.id, ctx.lead_id, offer.buyer.id)
    return deliverer.deliver(offer.buyer.endpoint_url, body, key, offer.buyer.post)


@dataclass
class SweepResult:
    sold: list[str] = field(default_factory=list)  # "publisher:lead" of each
    unsold: list[str] = field(default_factory=list)  # flagged for review
    left: int = 0  # found, but not finished this time (claimed by a retry, failed, out of time)

    def as_dict(self) -> dict[str, Any]:
        return {"sold": len(self.sold), "unsold": len(self.unsold), "left": self.left}


def abandoned(store: Store, buyer_ids: Iterable[str], now: datetime, cfg: Config) -> list[tuple[str, dict[str, Any]]]:
    """(attempt note key, note) of every lead whose routing died holding a lease reserved
    more than LEAD_ABANDONED_AFTER_MS ago, that no request claims now and whose note carries the
    lead (notes written before notes did are left to their publisher's retry). The leases
    are read a page at a time (`SCAN`), oldest first: those skipped (confirmed ones waiting
    for their settlement, held ones left for review) do not hide newer ones."""
    now_us = int(now.timestamp() * 1_000_000)
    newest = now_us - cfg.lead_abandoned_after_ms * 1000
    oldest = now_us - (cfg.lead_recovery_window_ms + 3_600_000) * 1000  # past it the lease has expired
    out = []
    for buyer_id in buyer_ids:
        start = 0
        while True:
            ids = cast(
                "list[str]", store.redis.zrangebyscore(keys.leases(buyer_id), oldest, newest, start=start, num=SCAN)
            )  # decoded replies
            out += _abandoned_of(store, buyer_id, ids)
            if len(ids) < SCAN:
                break
            start += SCAN
    return list(dict(out).items())  # a shared lead's note, found by each of its leases: once


def _abandoned_of(store: Store, buyer_id: str, lease_ids: list[str]) -> list[tuple[str, dict[str, Any]]]:
    if not lease_ids:
        return []
    pipe = store.redis.pipeline(transaction=False)
    for lease_id in lease_ids:
        pipe.hmget(keys.lease(buyer_id, lease_id), "state", "note")
    held = [
        (note_key, lease_id)
        for lease_id, (state, note_key) in zip(lease_ids, pipe.execute())
        if state is not None and note_key
    ]  # confirmed ones too: their settlement may be what died
    if not held:
        return []
    pipe = store.redis.pipeline(transaction=False)
    for note_key, _ in held:
        pipe.get(note_key)
        pipe.exists(_claim_key(note_key))
    values = pipe.execute()
    out = []
    for i, (note_key, lease_id) in enumerate(held):
        raw, claimed = values[2 * i], values[2 * i + 1]
        if raw is None or claimed:
            continue  # finished (the note goes with the answer), or a request holds the lead now
        try:
            note = json.loads(raw)
        except ValueError:
            log.error("attempt note %s is not JSON: left alone", note_key)
            continue
        named = [h.get("lease_id") for h in note["shared"]] if "shared" in note else [note.get("lease_id")]
        if lease_id not in named or "payload" not in note:
            continue  # a later offer's note (this lease is another's), or a note without the lead
        out.append((note_key, note))
    return out


def _claim_key(note_key: str) -> str:
    return note_key.removesuffix(":attempt")


def _lead_of(note_key: str, publisher_id: str) -> LeadKey:
    """The lead whose attempt note is `note_key` (keys.lead_attempt)."""
    return LeadKey(publisher_id, _claim_key(note_key).removeprefix(keys.lead_claim(publisher_id, "")))


@dataclass(frozen=True)
class Sweeper:
    """What the abandoned-lead sweep works with: the lead path's Redis, the settlement queue
    (its Redis and RQ queue), a deliverer for the re-offers and the config."""

    store: Store
    queue_redis: Store
    queue: Queue
    deliverer: Deliverer
    cfg: Config

    def end_abandoned(self, buyers: Iterable[BuyerRule], publisher: PublisherRule, note_key: str) -> Outcome | None:
        """Claim the lead of an abandoned attempt note as a publisher's retry would
        (lua/claim_lead.lua), offer it again (`reoffer`) and end it as a request does
        (settlement.end_lead): confirm a sale, remember the answer for the publisher's replays
        and queue the settlement, in one round trip; with Redis unreachable the settlement is
        written to the ledger directly. None when it is not this sweep's to end: a request
        claimed it first, it was ended meanwhile, or Redis lost its data lately; None too when
        neither the queue nor the ledger could take its settlement (logged "settlement LOST").

        The sweep runs outside gevent, where a buyer trickling its answer can hold the offer past
        the claim: it ends the lead as a late request does (settlement.end_in_time)."""
        store, queue_redis, queue, deliverer, cfg = self.store, self.queue_redis, self.queue, self.deliverer, self.cfg
        claim_key = _claim_key(note_key)
        claim_ttl = cfg.lead_claim_margin_ms + cfg.buyer_timeout_ms + 100
        lease_ttl_ms = claim_ttl + cfg.lead_recovery_window_ms
        token = claims.new_token(claims.ROUTING)
        started = time.monotonic()
        lead_key = _lead_of(note_key, publisher.id)
        got = store.claim_lead(
            lead_key, token, ttl_ms=claim_ttl, now_ms=int(time.time() * 1000), note_ttl_ms=lease_ttl_ms
        )
        claim = claims.Claim(claim_key, token)
        if got.outcome is not ClaimOutcome.CLAIMED:
            return None
        try:
            if got.dead_note is None:  # ended between the look and the claim
                claims.release(store, claim)
                return None
            note = json.loads(got.dead_note)
            lead = json.loads(note["payload"])
            lead.pop("lead_id", None)
            ctx = LeadContext(
                publisher=publisher,
                lead_id=note["lead_id"],
                lead=lead,
                payload=note["payload"],
                now=datetime.fromisoformat(note["at"]),
                request_id=note.get("request_id"),
                token=token,
                claim_ttl_ms=claim_ttl,
                lease_ttl_ms=lease_ttl_ms,
                deadline=started + claim_ttl / 1000,
            )
            outcome = reoffer(store, deliverer, buyers, ctx, note)
            item = settlement.make_item(
                publisher=publisher,
                lead_id=ctx.lead_id,
                outcome=outcome,
                payload=note["payload"],
                received_at=ctx.now,
                request_id=ctx.request_id,
            )
        except BaseException:
            claims.release(store, claim)  # the note stays: a retry or the next sweep takes the lead
            raise

        def queue_item(item: SettlementItem, batch: Batch | None, _answer: str) -> None:
            # the sweep's JSON as it has always been queued, non-ASCII escaped (the same item to a reader)
            raw = json.dumps(item.to_dict(), separators=(",", ":"))
            settle_queue.push(queue_redis.redis, queue, [raw], batch, request_id=item.request_id)

        ending = settlement.Settlement(
            store,
            queue_redis,
            queue_item,
            BreakerRule(cfg.breaker_failures, cfg.breaker_cooldown_ms),
            cfg.lead_replay_ttl_s,
            lookup_key=cfg.suppression_key.encode(),
        )
        ended = settlement.end_in_time(ending, ctx, outcome, item)
        if ended.holder is not None:
            return None  # the claim expired during the re-offer and a retry holds it now
        if not ended.ended:
            log.error(
                "abandoned lead %s:%s, %s on its re-offer: its settlement is in neither the queue "
                "nor the ledger (the line above holds it): not settled by this sweep",
                publisher.id,
                ctx.lead_id,
                outcome.status,
            )
            return None
        log.warning(
            "abandoned lead %s:%s settled %s by the sweep (its publisher never retried)",
            publisher.id,
            ctx.lead_id,
            outcome.status,
        )
        return outcome

    def sweep(
        self,
        buyers: tuple[BuyerRule, ...],
        buyer_ids: Iterable[str],
        publishers: dict[str, PublisherRule],
        now: datetime | None = None,
        budget_s: float = BUDGET_S,
    ) -> SweepResult:
        """End the abandoned leads (`abandoned`, `end_abandoned`) for `budget_s` at most (a job of
        the shared queue hands over within half a minute; the next run takes the rest). One
        lead's failure is logged and left for the next run; it does not stop the others.
        `buyers` are the active buyers (one switched off since is not asked again: its lead stays
        unsold for review), `buyer_ids` every buyer whose leases to look at, `publishers` by id."""
        now = now or datetime.now(timezone.utc)
        until = time.monotonic() + budget_s
        result = SweepResult()
        for note_key, note in abandoned(self.store, buyer_ids, now, self.cfg):
            publisher = publishers.get(note["publisher_id"])
            if publisher is None or time.monotonic() > until:
                result.left += 1
                continue
            try:
                outcome = self.end_abandoned(buyers, publisher, note_key)
            except Exception:
                log.exception("abandoned lead %s could not be ended: the next sweep tries again", note_key)
                outcome = None
            if outcome is None:
                result.left += 1
                continue
            ref = f"{note['publisher_id']}:{note['lead_id']}"
            (result.sold if outcome.status == LeadStatus.SOLD else result.unsold).append(ref)
        return result


def sweep_all(
    cfg: Config, store: Store, queue_redis: Store, queue: Queue, abandoned_after_ms: int | None = None
) -> SweepResult:
    """`Sweeper.sweep` with the current config of buyers and publishers read from the database (the
    leases of buyers switched off or deleted since are looked at too); `abandoned_after_ms`
    instead of LEAD_ABANDONED_AFTER_MS when given."""
    from webhooks.leads.rules.catalog import load_snapshot

    snapshot = load_snapshot(None, cfg.suppression_key)
    with db.connection_context():
        buyer_ids = [row.id for row in Buyer.select(Buyer.id)]
    publishers = {p.id: p for p in snapshot.publishers_by_key.values()}
    if abandoned_after_ms is not None:
        cfg = replace(cfg, lead_abandoned_after_ms=abandoned_after_ms)
    sweeper = Sweeper(store, queue_redis, queue, Deliverer(cfg.buyer_timeout_ms), cfg)
    return sweeper.sweep(snapshot.buyers, buyer_ids, publishers)
