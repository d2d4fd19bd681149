"""The waterfall: static filters in memory, an atomic lease per buyer, delivery, confirm or
refund, next buyer. Holds no Flask state; the view hands it what it needs."""

from __future__ import annotations

import functools
import itertools
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

import gevent
from gevent import monkey

from webhooks import metrics
from webhooks.billing.charges import Charged
from webhooks.caps import leases, rebuild
from webhooks.caps.dedupe import consumer_keys
from webhooks.caps.leases import Reservation
from webhooks.errors import InvalidLead, Unavailable
from webhooks.formats import consumer
from webhooks.formats.validate import cents
from webhooks.leads.path.context import LeadContext, lead_ref
from webhooks.leads.posting.delivery import ACCEPTED, CIRCUIT_OPEN, ERROR, NOT_SENT, Deliverer
from webhooks.leads.posting.integration import RenderBudgetExceeded
from webhooks.leads.rules import consent, earnings, suppression
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.leads.rules.catalog import Snapshot
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.live import keys
from webhooks.storage.live.batch import Batch, Client, Pending
from webhooks.storage.live.redis import Store
from webhooks.storage.live.scripts import BreakerRule, Lease
from webhooks.storage.states import AttemptOutcome, Circuit, LeadStatus, ReservationStatus

log = logging.getLogger(__name__)
T = TypeVar("T")

LEASE_MARGIN_MS = 10_000
OFFER_SLACK_S = 0.5  # beyond the buyer deadline: recording an offer's outcome


__all__ = [
    "LeadContext",
    "Offer",
    "Opening",
    "Outcome",
    "Reservation",
    "Route",
    "Router",
    "Sharing",
    "Sold",
    "attempt_note",
    "attempt_view",
    "candidates",
    "idempotency_key",
    "lead_ref",
]


@dataclass(frozen=True)
class Sold:
    """One sale of a lead beyond its first (a shared lead's): to whom, at what price, on which
    lease, and what it debits from a billed buyer."""

    buyer_id: str
    price: Decimal
    lease: Lease
    charge: Charged | None = None
    lease_finished: bool = False  # confirmed by a request that died, or gone with its settlement


@dataclass
class Outcome:
    status: LeadStatus = LeadStatus.UNSOLD
    buyer_id: str | None = None
    price: Decimal | None = None
    sold_at: datetime | None = None
    lease: Lease | None = None
    # the sale's lease needs no finish: confirmed by a request that died, or gone with its
    # settlement (finishing a gone lease would close the buyer's circuits: lua/finish_lease.lua)
    lease_finished: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # the routing trace: buyers not attempted, why
    waiting_for_rebuild: bool = False  # a buyer was skipped because its counters are rebuilding
    out_of_time: bool = False  # stopped before an offer its claim might not outlive (a stall)
    charge: Charged | None = None  # what the sale debits from a billed buyer's wallet
    consent: list[dict[str, Any]] = field(default_factory=list)  # the consent claims made for the lead
    more: list[Sold] = field(default_factory=list)  # a shared lead's sales after the first

    def sell(self, sales: Sequence[Sold], sold_at: datetime) -> None:
        """A shared lead's sales, the first in the lead's own fields (as an exclusive sale's)."""
        first = sales[0]
        self.status, self.buyer_id, self.price, self.sold_at = LeadStatus.SOLD, first.buyer_id, first.price, sold_at
        self.lease, self.charge, self.lease_finished = first.lease, first.charge, first.lease_finished
        self.more = list(sales[1:])

    @property
    def leases(self) -> list[Lease]:
        """The leases of its sales still to be confirmed (at its end: settlement.end_lead)."""
        first = [] if self.lease is None or self.lease_finished else [self.lease]
        return first + [s.lease for s in self.more if not s.lease_finished]


def candidates(
    buyers: tuple[BuyerRule, ...],
    lead: dict[str, Any],
    publisher_id: str,
    now: datetime,
    inactive: tuple[str, ...] = (),
) -> tuple[list[BuyerRule], list[dict[str, Any]]]:
    """The buyers the static filters (and each buyer's `filter` on the normalised lead) pass,
    in order, and the trace of those they refuse (inactive buyers first)."""
    passed, skipped = [], [{"buyer_id": b, "reason": "inactive"} for b in inactive]
    for b in buyers:
        reason = b.refusal(lead, publisher_id, now)
        if reason is None:
            passed.append(b)
        else:
            skipped.append({"buyer_id": b.id, "reason": reason})
    return passed, skipped


def consumers_of(buyers: list[BuyerRule], values: Mapping[str, str | None]) -> dict[str, tuple[str, ...]]:
    """The lead's dedupe keys at each of `buyers` that dedupes: computed once per lead."""
    return {b.id: tuple(consumer_keys(b.id, b.dedupe_fields, values)) for b in buyers if b.dedupe_fields}


def consumer_values(
    snapshot: Snapshot, publisher: PublisherRule, buyers: list[BuyerRule], lead: dict[str, Any]
) -> dict[str, str | None]:
    """The lead's consumer keys (webhooks/formats/consumer.py) of every field its suppression lists or
    its buyers' dedupe check, a phone read as the publisher's field spec says; InvalidLead
    naming each such field whose value is not a string (or is too long to be one)."""
    lists = set(publisher.suppress).union(*(b.suppress for b in buyers))
    fields = {snapshot.suppression[i].field for i in lists if i in snapshot.suppression}
    fields.update(*(b.dedupe_fields for b in buyers))
    regions = publisher.spec.regions() if publisher.spec is not None else {}
    try:
        return consumer.keys_of(lead, sorted(fields), regions)
    except consumer.InvalidConsumerFields as exc:
        raise InvalidLead(f"the lead's consumer fields cannot be checked: {exc}", fields=exc.fields) from None


def buyer_body(lead_id: str, publisher_id: str, price: Decimal | str, lead_json: str) -> bytes:
    """The default contract's post (docs/api.md "What a buyer receives"), built without re-encoding
    the lead."""
    return (
        '{"lead_id":%s,"publisher_id":%s,"price":"%s","lead":%s}'
        % (json.dumps(lead_id), json.dumps(publisher_id), price, lead_json)
    ).encode()


def idempotency_key(publisher_id: str, lead_id: str, buyer_id: str) -> str:
    return f"{publisher_id}:{lead_id}:{buyer_id}"


def attempt_note(
    *,
    attempt_key: str,
    offer: Offer,
    now: datetime,
    attempts: list[dict[str, Any]],
    ttl_ms: int,
    ref: dict[str, Any] | None = None,
) -> leases.Note:
    """What a retry needs to offer the lead again to this buyer alone if this request dies:
    where, at what price (its bid), the ping reply, the time whose windows the lease counts
    in, and the attempts before it. `ref` (publisher_id, lead_id, payload, request_id: see
    `LeadContext.ref`) lets the abandoned-lead sweep (leads/path/recovery.py) do it when the
    publisher never retries."""
    return leases.Note(
        attempt_key,
        {
            "url": offer.buyer.endpoint_url,
            "price": f"{offer.price:.2f}",
            "bid": None if offer.bid is None else f"{offer.bid:.2f}",
            "ping": offer.ping_reply,
            "at": now.isoformat(),
            "attempts": attempts,
            **(ref or {}),
        },
        ttl_ms,
    )


@dataclass
class Offer:
    """A buyer as this lead will be offered to it: at its price, or at its bid."""

    buyer: BuyerRule
    price: Decimal
    bid: Decimal | None = None  # ping/post buyers
    ping_reply: Any = None

    def body(self, lead_id: str, publisher_id: str, lead: dict[str, Any], lead_json: str) -> bytes:
        default = buyer_body(lead_id, publisher_id, self.price, lead_json)
        if self.buyer.post.fields is None:
            return default
        return self.buyer.post.body(
            {
                "lead": lead,
                "lead_id": lead_id,
                "publisher_id": publisher_id,
                "buyer_id": self.buyer.id,
                "price": f"{self.price:.2f}",
                "ping": self.ping_reply,
            },
            default,
        )


@dataclass(frozen=True, kw_only=True)
class Route:
    """The buyers a lead may go to: those the static filters pass, the trace of those they
    refuse, the offers' order when it needs no I/O (`Router.plan`) and the lead's dedupe keys."""

    buyers: list[BuyerRule]
    skipped: list[dict[str, Any]]
    plan: list[Offer] | None
    consumers: dict[str, tuple[str, ...]]
    suppressed: bool = False  # the publisher's suppression lists hold the lead: refused before routing


@dataclass(frozen=True)
class Opening:
    """The first offer's reservation and its attempt note, for the claim's round trip."""

    reservation: leases.PreparedReservation
    note: str

    def queue(self, batch: Batch) -> Pending[Reservation]:
        return self.reservation.queue(batch)


def order(
    offers: list[Offer],
    mode: str,
    rotation: dict[int, int] | None = None,
    earned: Mapping[str, earnings.Tally] | None = None,
    prior_offers: int = 2,
) -> list[Offer]:
    """The offers in the order `mode` gives (docs/api.md "Routing modes"), exclusive buyers'
    before shared buyers' (each in that order). `rotation` is, per priority, the round-robin
    counter of this lead; `earned`, the buyers' earnings for its publisher (`epl`: none known
    ranks every buyer as new; `prior_offers`: EPL_PRIOR_OFFERS)."""
    if mode == "epl":
        ordered = earnings.rank(offers, earned or {}, prior_offers=prior_offers)
    else:
        ordered = _order(offers, mode, rotation)
    if not any(o.buyer.shared for o in ordered):
        return ordered
    return [o for o in ordered if not o.buyer.shared] + [o for o in ordered if o.buyer.shared]


def _order(offers: list[Offer], mode: str, rotation: dict[int, int] | None) -> list[Offer]:
    if mode == "price":
        return sorted(offers, key=lambda o: (-o.price, o.buyer.priority, o.buyer.id))
    ranked = sorted(offers, key=lambda o: (o.buyer.priority, -o.price, o.buyer.id))
    if mode not in ("round_robin", "weighted"):
        return ranked
    out: list[Offer] = []
    for priority, grouped in itertools.groupby(ranked, key=lambda o: o.buyer.priority):
        group = list(grouped)
        if mode == "round_robin":
            start = (rotation or {}).get(priority, 0) % len(group)
            out += group[start:] + group[:start]
        else:  # weighted: a random order in which each buyer leads with a chance of its share
            out += sorted(group, key=lambda o: random.random() ** (1.0 / o.buyer.weight), reverse=True)
    return out


@dataclass(kw_only=True)
class Router:
    """Everything routing needs, built once per process."""

    store: Store  # caps, leases and breakers
    queue_redis: Client  # Redis holding unsettled sales (counted by a rebuild)
    deliverer: Deliverer
    buyer_timeout_ms: int
    breaker_failures: int
    breaker_cooldown_ms: int
    ping_timeout_ms: int = 300
    max_bid: Decimal = Decimal("1000.00")  # PING_MAX_BID: a bid above it is no bid
    epl_prior_offers: int = 2  # EPL_PRIOR_OFFERS: a new buyer's doubt under `epl` routing
    epl_half_life_days: float = 0.5  # EPL_HALF_LIFE_HOURS / 24: how fast its figures fade
    recent: earnings.Recent = field(default_factory=earnings.Recent)  # `epl` figures as last read
    trustedform: consent.TrustedForm | None = None  # None: no claim is made (buyers requiring one get no lead)

    @property
    def claims_consent(self) -> bool:
        """Whether TrustedForm certificates can be claimed (a client with a key)."""
        return self.trustedform is not None and bool(self.trustedform.api_key)

    @property
    def probe_ttl_ms(self) -> int:
        return self.buyer_timeout_ms + LEASE_MARGIN_MS

    @property
    def offer_s(self) -> float:
        """The longest one offer may take, with room to record its outcome."""
        return self.buyer_timeout_ms / 1000 + OFFER_SLACK_S

    @property
    def breaker(self) -> BreakerRule:
        return BreakerRule(self.breaker_failures, self.breaker_cooldown_ms)

    def _refund(self, lease: Lease, outcome: AttemptOutcome, attempt_key: str | None, replied: bool = True) -> None:
        """Refund a reservation (feeding the buyer's circuits with `outcome`; `withdrawn`
        leaves them alone) and, with `attempt_key`, forget the attempt note: one round trip.
        A refund that cannot reach Redis raises: the slot stays taken (safe for the cap; the
        reconciliation gives it back) and the publisher gets a 503 to retry."""
        with self.store.batch() as b:
            leases.finish_in(b, lease, outcome, self.breaker, replied=replied)
            if attempt_key is not None:
                b.delete(attempt_key)

    def select(
        self, snapshot: Snapshot, publisher: PublisherRule, lead: dict[str, Any], now: datetime, test: bool
    ) -> Route:
        """The route of one lead (`candidates`, `plan`; no plan for a test lead)."""
        buyers, skipped = candidates(snapshot.buyers, lead, publisher.id, now, snapshot.inactive)
        values = consumer_values(snapshot, publisher, buyers, lead)
        suppressed, buyers = self._suppress(snapshot, publisher, buyers, values, skipped)
        plan = None if test or suppressed else self.plan(buyers, publisher)
        return Route(
            buyers=buyers, skipped=skipped, plan=plan, consumers=consumers_of(buyers, values), suppressed=suppressed
        )

    def _suppress(
        self,
        snapshot: Snapshot,
        publisher: PublisherRule,
        buyers: list[BuyerRule],
        values: Mapping[str, str | None],
        skipped: list[dict[str, Any]],
    ) -> tuple[bool, list[BuyerRule]]:
        """The lead against the publisher's suppression lists and those of the buyers that
        may be offered it, in one round trip (leads/rules/suppression.py): whether the
        publisher's lists hold it, and the buyers whose lists leave it to them; a buyer whose
        list has it, or whose list Redis does not hold all of now, is skipped (reason
        `suppressed`, `suppression_unavailable`). Unavailable (503) while Redis does not hold
        all of a publisher's list (after a data loss, until it is loaded again): a post and a
        pre-ping alike."""
        wanted = set(publisher.suppress).union(*(b.suppress for b in buyers))
        lists = [snapshot.suppression[i] for i in sorted(wanted) if i in snapshot.suppression]
        if not lists:
            return False, buyers
        verdicts = suppression.check(self.store, lists, values)
        mine = [verdicts.get(i, suppression.MISS) for i in publisher.suppress]
        if suppression.HIT in mine:
            return True, buyers
        if suppression.UNKNOWN in mine:
            raise Unavailable(
                "a suppression list of this publisher is being loaded into Redis again; retry shortly", retry_after_s=5
            )
        kept = []
        for b in buyers:
            seen = [verdicts.get(i, suppression.MISS) for i in b.suppress]
            if suppression.HIT in seen:
                skipped.append({"buyer_id": b.id, "reason": suppression.SUPPRESSED})
            elif suppression.UNKNOWN in seen:
                skipped.append({"buyer_id": b.id, "reason": "suppression_unavailable"})
            else:
                kept.append(b)
        return False, kept

    def opening(self, ctx: LeadContext, route: Route) -> Opening | None:
        """The reservation of the planned first offer and its attempt note, to be made in the
        claim's round trip; None without a plan, or when a reservation must WAIT for replicas
        on its own connection."""
        if not route.plan or self.store.cap_wait.replicas:
            return None
        offer = route.plan[0]
        if offer.buyer.require_consent or offer.buyer.shared:  # consent known first; shared: in a wave
            return None
        hold = offer.buyer.hold(offer.price)
        if hold is None:  # a price the buyer's currency cannot count: route() skips it
            return None
        call = leases.prepare(
            offer.buyer,
            ctx.now,
            lease_ttl_ms=ctx.lease_ttl_ms,
            probe_ttl_ms=self.probe_ttl_ms,
            consumer=ctx.consumers.get(offer.buyer.id, ()),
            price_minor=cents(offer.price),
            note_key=ctx.attempt_key,
            publisher_id=ctx.publisher.id,
            hold=hold,
        )
        note = attempt_note(
            attempt_key=ctx.attempt_key, offer=offer, now=ctx.now, attempts=[], ttl_ms=ctx.lease_ttl_ms, ref=ctx.ref
        )
        return Opening(call, note.value(call.lease))

    def withdraw(self, reservation: Reservation | None) -> None:
        """Give back a reservation granted but not to be offered (if one was)."""
        if reservation is not None and reservation.lease is not None:
            leases.withdraw(self.store, reservation.lease)

    def plan(self, buyers: list[BuyerRule], publisher: PublisherRule) -> list[Offer] | None:
        """The order of the offers when it needs no I/O (no ping/post buyer, no round-robin
        counter; an `epl` publisher's figures read lately by this process): then the lead path
        reserves the first one in its claim's round trip."""
        if publisher.routing == "round_robin" or any(b.ping is not None for b in buyers):
            return None
        earned = None
        if publisher.routing == "epl":
            seen = self.recent.get(publisher.id)
            if seen is None or not seen[0]:  # never read, or being rebuilt: ordered after the claim
                return None
            earned = seen[1]
        return order([Offer(b, b.price) for b in buyers], publisher.routing, None, earned, self.epl_prior_offers)

    def route(self, ctx: LeadContext, route: Route, first: Reservation | None = None) -> Outcome:
        """Offer the lead along `route` in the publisher's routing order until a buyer accepts
        it (`first`: the `opening` reserved in the claim's round trip). Each reservation
        writes the attempt note; an offer that could end after `ctx.deadline` is not made
        (`out_of_time`). The steps: docs/leads.md "The lead path"."""
        publisher = ctx.publisher
        out = Outcome(skipped=list(route.skipped))
        plan = route.plan
        if plan is None:
            offers = self._bids(ctx, route.buyers, out)
            rotation = self._rotation(offers) if publisher.routing == "round_robin" else None
            plan = order(offers, publisher.routing, rotation, ctx.earned, self.epl_prior_offers)
        lead_json = json.dumps(ctx.lead, separators=(",", ":"))
        check = self._consent(ctx, route)
        shared = [o for o in plan if o.buyer.shared]
        if shared:
            plan = plan[: len(plan) - len(shared)]  # exclusive buyers first (`order`)
        for i, offer in enumerate(plan):
            if offer.buyer.require_consent and not check.allows(offer.buyer.require_consent):
                out.skipped.append({"buyer_id": offer.buyer.id, "reason": "consent"})
                out.consent = check.records()
                continue
            reservation = first if i == 0 and first is not None else self._reserve(ctx, offer, out)
            lease = self._usable(reservation, offer, out)
            if lease is None:
                continue
            if time.monotonic() + self.offer_s > ctx.deadline:
                # The note is ours to delete only while the claim surely is.
                self._refund(lease, leases.WITHDRAWN, ctx.attempt_key if time.monotonic() < ctx.deadline else None)
                out.out_of_time = True
                return out
            outcome, ms, replied = self._deliver(ctx, offer, lead_json)
            if outcome == NOT_SENT:
                # This lead could not be made into a request for this buyer: the buyer was not
                # called, so its breaker and its reply statistics are left alone.
                self._refund(lease, leases.WITHDRAWN, ctx.attempt_key)
                out.skipped.append({"buyer_id": offer.buyer.id, "reason": NOT_SENT})
                continue
            out.attempts.append(attempt_view(offer.buyer.id, offer.bid, outcome, ms))
            metrics.attempt(offer.buyer.id, outcome, ms)
            if outcome == ACCEPTED:
                # Confirmed by the caller, in the same round trip that records the answer.
                out.status, out.buyer_id, out.price = LeadStatus.SOLD, offer.buyer.id, offer.price
                out.sold_at, out.lease, out.charge = ctx.now, lease, offer.buyer.charge(offer.price)
                out.consent = check.records()
                return out
            # The buyer said no: give the slot back and forget the attempt.
            self._refund(lease, outcome, ctx.attempt_key, replied)
        if shared:
            Sharing(self, ctx, out, lead_json).offer([o for o in shared if self._consented(o, check, out)])
        out.consent = check.records()
        return out

    def _consented(self, offer: Offer, check: consent.Check, out: Outcome) -> bool:
        """Whether the lead may be offered to `offer`'s buyer as far as consent goes (else skipped)."""
        if offer.buyer.require_consent and not check.allows(offer.buyer.require_consent):
            out.skipped.append({"buyer_id": offer.buyer.id, "reason": "consent"})
            return False
        return True

    def _consent(self, ctx: LeadContext, route: Route) -> consent.Check:
        """The lead's consent check: its TrustedForm claim started now, beside the offers, when
        a buyer it may go to requires one (leads/rules/consent.py)."""
        required = set().union(*(b.require_consent for b in route.buyers))
        if not required:
            return consent.Check()
        if self.trustedform is None:
            return consent.Check(claim={"kind": consent.TRUSTEDFORM, "outcome": consent.NOT_CONFIGURED})
        return consent.start(
            self.store,
            self.trustedform,
            fields=ctx.publisher.consent,
            required=required,
            lead=ctx.lead,
            publisher_id=ctx.publisher.id,
            lead_id=ctx.lead_id,
            deadline=ctx.deadline - self.offer_s,
        )

    def _reserve(self, ctx: LeadContext, offer: Offer, out: Outcome) -> Reservation:
        """Reserve a slot under every cap of the offer's buyer (and its dedupe keys), writing
        the attempt note in the same round trip. A billed buyer's price is held against its
        balance in the same script (BALANCE when it cannot afford it)."""
        buyer = offer.buyer
        hold = buyer.hold(offer.price)
        if hold is None:
            return Reservation(ReservationStatus.BALANCE)
        return leases.reserve(
            self.store,
            buyer,
            ctx.now,
            lease_ttl_ms=ctx.lease_ttl_ms,
            probe_ttl_ms=self.probe_ttl_ms,
            note=attempt_note(
                attempt_key=ctx.attempt_key,
                offer=offer,
                now=ctx.now,
                attempts=out.attempts,
                ttl_ms=ctx.lease_ttl_ms,
                ref=ctx.ref,
            ),
            consumer=ctx.consumers.get(buyer.id, ()),
            price_minor=cents(offer.price),
            publisher_id=ctx.publisher.id,
            hold=hold,
        )

    def _usable(self, reservation: Reservation, offer: Offer, out: Outcome) -> Lease | None:
        """The reservation's lease, or None with the reason the buyer is passed over written
        into `out` (a full cap, a duplicate consumer, counters being rebuilt, an open circuit)."""
        buyer, status = offer.buyer, reservation.status
        if status is ReservationStatus.FULL:
            out.skipped.append({"buyer_id": buyer.id, "reason": f"cap_full:{reservation.cap}"})
        elif status in (ReservationStatus.DUPLICATE, ReservationStatus.BALANCE):
            out.skipped.append({"buyer_id": buyer.id, "reason": status})
        elif status is ReservationStatus.NOT_READY:
            rebuild.request(self.store, self.queue_redis, buyer, self.buyer_timeout_ms)
            out.waiting_for_rebuild = True
        elif status is ReservationStatus.CIRCUIT_OPEN:
            # which circuit: the buyer's own (every publisher) or its one for this publisher
            circuit = reservation.circuit or Circuit.BUYER
            out.attempts.append({**attempt_view(buyer.id, offer.bid, CIRCUIT_OPEN, 0), "circuit": circuit})
            out.skipped.append({"buyer_id": buyer.id, "reason": CIRCUIT_OPEN, "circuit": circuit})
            metrics.attempt(buyer.id, CIRCUIT_OPEN)
        else:
            assert reservation.lease is not None  # status OK
            return reservation.lease
        return None

    def _deliver(self, ctx: LeadContext, offer: Offer, lead_json: str) -> tuple[AttemptOutcome, int, bool]:
        """Post the lead to the offer's buyer: its outcome, duration and whether the buyer
        replied; NOT_SENT when the lead cannot be made into a request within the template's
        budget."""
        buyer, publisher_id = offer.buyer, ctx.publisher.id
        try:
            body = offer.body(ctx.lead_id, publisher_id, ctx.lead, lead_json)
        except RenderBudgetExceeded:
            return NOT_SENT, 0, False
        return self.deliverer.post(
            buyer.endpoint_url, body, idempotency_key(publisher_id, ctx.lead_id, buyer.id), buyer.post
        )

    def try_out(self, ctx: LeadContext, route: Route) -> Outcome:
        """A test lead: the route it would take, with every write replaced by a read. Ping/post
        buyers are pinged (marked as a test); the offers are ordered as the publisher's mode
        orders them (round robin from each group's first: the shared rotation is not moved);
        caps, dedupe and circuits are read (leases.room), nothing is reserved, and no buyer is
        posted to; no consent claim is made (a buyer requiring consent is passed over unless
        the lead carries the evidence, consent.possible). The outcome is SOLD to the buyer
        that would have been offered the lead first with room for it (its lease None), or
        UNSOLD; its attempts are none."""
        out = Outcome(skipped=list(route.skipped))
        offers = self._bids(ctx, route.buyers, out)
        plan = order(offers, ctx.publisher.routing)
        fixed = [o.buyer for o in plan if o.buyer.ping is None]  # pingers: read before their ping
        room = {}
        if fixed:
            room = leases.room(self.store, fixed, ctx.now, consumers=ctx.consumers, publisher_id=ctx.publisher.id)
        for offer in plan:
            reason = room.get(offer.buyer.id)
            if reason is None and not consent.possible(
                offer.buyer.require_consent, ctx.publisher.consent, ctx.lead, self.claims_consent
            ):
                reason = "consent"  # no claim for a test lead: the evidence must be there
            if reason is not None:
                out.skipped.append({"buyer_id": offer.buyer.id, "reason": reason})
                continue
            out.status, out.buyer_id, out.price = LeadStatus.SOLD, offer.buyer.id, offer.price
            break
        return out

    def _bids(self, ctx: LeadContext, buyers: list[BuyerRule], out: Outcome) -> list[Offer]:
        """An offer per buyer: fixed-price buyers as they are; ping/post buyers that have room
        and an open circuit are pinged at once under one PING_TIMEOUT_MS deadline (marked as a
        test for a test lead), and take part at their bid (no usable bid: skipped as no_bid)."""
        offers = {b.id: Offer(b, b.price) for b in buyers if b.ping is None}
        pingers = [b for b in buyers if b.ping is not None]
        if not pingers:
            return list(offers.values())
        room = leases.room(
            self.store,
            pingers,
            ctx.now,
            budget_minor={b.id: max(1, cents(b.ping.min_bid)) for b in pingers if b.ping},
            consumers=ctx.consumers,
            publisher_id=ctx.publisher.id,
        )
        for b in pingers:
            if room[b.id] is not None:
                out.skipped.append({"buyer_id": b.id, "reason": room[b.id]})
        pingers = [b for b in pingers if room[b.id] is None]
        deadline = time.monotonic() + self.ping_timeout_ms / 1000
        calls = [functools.partial(self._ping, ctx, b, deadline) for b in pingers]
        for b, result in zip(pingers, fan_out(calls, self.ping_timeout_ms / 1000)):
            bid, reply = result if result is not None else (None, None)  # failed or late: no bid
            if reply is NOT_SENT:
                out.skipped.append({"buyer_id": b.id, "reason": NOT_SENT})
            elif bid is None:
                out.skipped.append({"buyer_id": b.id, "reason": "no_bid"})
            else:
                offers[b.id] = Offer(b, bid, bid, reply)
        return [offers[b.id] for b in buyers if b.id in offers]

    def _ping(self, ctx: LeadContext, b: BuyerRule, deadline: float) -> tuple[Decimal | None, Any]:
        """A ping/post buyer's bid for the lead and its reply (None, NOT_SENT when the ping
        cannot be made within the template's budget; no bid for a failure or one over max_bid)."""
        spec = b.ping
        assert spec is not None  # a pinger
        try:
            body = spec.body(
                {
                    "lead": ctx.lead,
                    "lead_id": ctx.lead_id,
                    "publisher_id": ctx.publisher.id,
                    "buyer_id": b.id,
                    "price": f"{b.price:.2f}",
                }
            )
        except RenderBudgetExceeded:
            return None, NOT_SENT
        status, content, failure, _ms = self.deliverer.ping(
            spec.url, body, max(0.001, deadline - time.monotonic()), ctx.test
        )
        if failure == NOT_SENT:
            return None, NOT_SENT
        if failure is not None or not 200 <= status < 300:
            return None, None
        bid, reply = spec.read_bid(content)
        if bid is not None and bid > self.max_bid:
            log.info("bid %s of buyer %s is above PING_MAX_BID: ignored", bid, b.id)
            return None, reply
        return bid, reply

    def _rotation(self, offers: list[Offer]) -> dict[int, int]:
        """Round robin: this lead's turn in each priority group, shared by every process (one
        INCR per group, all in one round trip)."""
        priorities = sorted({o.buyer.priority for o in offers})
        if not priorities:
            return {}
        pipe = self.store.redis.pipeline(transaction=False)
        for p in priorities:
            pipe.incr(keys.round_robin(p))
        return {p: n - 1 for p, n in zip(priorities, pipe.execute())}


@dataclass
class Sharing:
    """A lead offered to shared buyers (no exclusive buyer took it), in waves: as many buyers as
    sales are still wanted (the publisher's `max_sales`) are reserved in one round trip, offered
    the lead at once, and those that said no or could not answer give their slot back; the next
    wave takes the next buyers, until `max_sales` said yes, none is left or time runs out.

    The attempt note lists every lease the lead holds (the yeses so far and the wave out now),
    written in the round trip that reserves the wave: a retry after this process dies offers the
    lead again to those buyers alone (leads/path/recovery.py `reoffer_shared`), none new."""

    router: Router
    ctx: LeadContext
    out: Outcome
    lead_json: str
    sold: list[tuple[Offer, Lease]] = field(default_factory=list)

    def offer(self, offers: list[Offer]) -> None:
        queue = list(offers)
        want = self.ctx.publisher.max_sales
        while queue and len(self.sold) < want:
            wave = self._reserve(queue, want - len(self.sold))
            if not wave:
                break
            if time.monotonic() + self.router.offer_s > self.ctx.deadline:
                self._settle_wave([(o, lease, leases.WITHDRAWN, True) for o, lease in wave])
                self.out.out_of_time = not self.sold  # with yeses: sold to them, no further offer
                break
            calls = [functools.partial(self.router._deliver, self.ctx, o, self.lead_json) for o, _ in wave]
            answered = fan_out(calls, self.router.offer_s)
            refunds = []
            for (offer, lease), result in zip(wave, answered):
                outcome, ms, replied = result if result is not None else (ERROR, 0, False)
                if outcome == NOT_SENT:
                    refunds.append((offer, lease, leases.WITHDRAWN, True))
                    self.out.skipped.append({"buyer_id": offer.buyer.id, "reason": NOT_SENT})
                    continue
                self.out.attempts.append(attempt_view(offer.buyer.id, offer.bid, outcome, ms))
                metrics.attempt(offer.buyer.id, outcome, ms)
                if outcome == ACCEPTED:
                    self.sold.append((offer, lease))
                else:
                    refunds.append((offer, lease, outcome, replied))
            if refunds:
                self._settle_wave(refunds)
        if self.sold:
            sales = [Sold(o.buyer.id, o.price, lease, o.buyer.charge(o.price)) for o, lease in self.sold]
            self.out.sell(sales, self.ctx.now)

    def _note(self, held: list[tuple[Offer, Lease]]) -> str:
        """The attempt note of a shared lead holding `held` (docs/leads.md "Shared leads")."""
        return shared_note(self.ctx, held, self.out.attempts)

    def _reserve(self, queue: list[Offer], room: int) -> list[tuple[Offer, Lease]]:
        """Reserve the next buyers of `queue` (taken off it) until `room` are held or none is
        left: each batch in one round trip with the note naming the yeses so far and the batch
        (rewritten when some of the batch were refused, so that it names leases that exist)."""
        router, ctx = self.router, self.ctx
        wave: list[tuple[Offer, Lease]] = []
        while queue and len(wave) < room:
            batch: list[tuple[Offer, leases.PreparedReservation]] = []
            while queue and len(batch) < room - len(wave):
                offer = queue.pop(0)
                hold = offer.buyer.hold(offer.price)
                if hold is None:
                    self.out.skipped.append({"buyer_id": offer.buyer.id, "reason": ReservationStatus.BALANCE})
                    continue
                batch.append((offer, self._prepare(offer, hold)))
            if not batch:
                break
            reserved = self._send(batch, wave)
            granted = []
            for (offer, _), reservation in zip(batch, reserved):
                lease = router._usable(reservation, offer, self.out)
                if lease is not None:
                    granted.append((offer, lease))
            wave += granted
            if len(granted) < len(batch):
                router.store.redis.set(ctx.attempt_key, self._note(self.sold + wave), px=ctx.lease_ttl_ms)
        return wave

    def _prepare(self, offer: Offer, hold: Any) -> leases.PreparedReservation:
        ctx = self.ctx
        return leases.prepare(
            offer.buyer,
            ctx.now,
            lease_ttl_ms=ctx.lease_ttl_ms,
            probe_ttl_ms=self.router.probe_ttl_ms,
            consumer=ctx.consumers.get(offer.buyer.id, ()),
            price_minor=cents(offer.price),
            note_key=ctx.attempt_key,
            publisher_id=ctx.publisher.id,
            hold=hold,
        )

    def _send(
        self, batch: list[tuple[Offer, leases.PreparedReservation]], wave: list[tuple[Offer, Lease]]
    ) -> list[Reservation]:
        """Make `batch`'s reservations, the note (naming them all) written in the same round trip;
        one at a time where each must WAIT for replicas on its own connection."""
        store, ctx = self.router.store, self.ctx
        note = self._note(self.sold + wave + [(o, call.lease) for o, call in batch])
        if store.cap_wait.replicas:
            store.redis.set(ctx.attempt_key, note, px=ctx.lease_ttl_ms)
            return [leases.send_replicated(store, call) for _, call in batch]
        with store.batch() as b:
            pending = [call.queue(b) for _, call in batch]
            b.set(ctx.attempt_key, note, px=ctx.lease_ttl_ms)
        return [p.value for p in pending]

    def _settle_wave(self, refunds: list[tuple[Offer, Lease, AttemptOutcome, bool]]) -> None:
        """Give back the slots of the buyers that did not buy, and leave the note naming only the
        yeses (none: the note goes), in one round trip. Raises when Redis cannot be reached: the
        slots stay taken (reconciliation gives them back) and the publisher gets a 503."""
        router, ctx = self.router, self.ctx
        with router.store.batch() as b:
            for _, lease, outcome, replied in refunds:
                leases.finish_in(b, lease, outcome, router.breaker, replied=replied)
            if self.sold:
                b.set(ctx.attempt_key, self._note(self.sold), px=ctx.lease_ttl_ms)
            elif time.monotonic() < ctx.deadline:  # ours to delete only while the claim surely is
                b.delete(ctx.attempt_key)


def shared_note(ctx: LeadContext, held: list[tuple[Offer, Lease]], attempts: list[dict[str, Any]]) -> str:
    """A shared lead's attempt note: each lease it holds with what offering it again needs (the
    buyer's url, price, bid and ping reply), the time whose windows they count in, the
    attempts so far and the lead itself (`LeadContext.ref`)."""
    return json.dumps(
        {
            "shared": [
                {
                    "buyer_id": lease.buyer_id,
                    "lease_id": lease.lease_id,
                    "counters": list(lease.counters),
                    "dedupe": list(lease.dedupe),
                    "url": offer.buyer.endpoint_url,
                    "price": f"{offer.price:.2f}",
                    "bid": None if offer.bid is None else f"{offer.bid:.2f}",
                    "ping": offer.ping_reply,
                }
                for offer, lease in held
            ],
            "at": ctx.now.isoformat(),
            "attempts": attempts,
            **ctx.ref,
        },
        separators=(",", ":"),
    )


def attempt_view(buyer_id: str, bid: Decimal | None, outcome: AttemptOutcome, ms: int) -> dict[str, Any]:
    """One attempt as answers and the ledger show it; ping/post buyers carry their bid."""
    attempt = {"buyer_id": buyer_id, "outcome": outcome, "ms": ms}
    if bid is not None:
        attempt["bid"] = f"{bid:.2f}"
    return attempt


def fan_out(calls: Sequence[Callable[[], T]], timeout_s: float) -> list[T | None]:
    """Run `calls` at once and return their results in order (None for one that failed or
    was still running at `timeout_s`): greenlets in the gevent-patched web process (a late
    one killed and unwound before this returns), threads elsewhere (the CLI, a worker's
    sweep, tests in-process), from one pool kept for the process: each thread keeps its gevent
    hub and its connections (a thread per call made a hub per call: about 1.7 GB in bench.calls
    of shared leads). A late call in a thread runs on to its own deadline (every call here has
    one: webhooks/outbound.py)."""
    if not calls:
        return []
    if len(calls) == 1:
        try:
            return [calls[0]()]
        except Exception:
            log.exception("fanned-out call failed")
            return [None]
    if monkey.is_module_patched("socket"):
        jobs = [gevent.spawn(c) for c in calls]
        gevent.joinall(jobs, timeout=timeout_s + 0.05)
        late = [job for job in jobs if not job.ready()]
        if late:  # ended here, their sockets closed now: a kill left pending would run in a later call
            gevent.killall(late, block=True, timeout=1.0)
        return [None if job in late or not job.successful() else job.value for job in jobs]
    deadline = time.monotonic() + timeout_s + 0.05
    futures = [_threads().submit(c) for c in calls]
    results: list[T | None] = []
    for f in futures:
        try:
            results.append(f.result(timeout=max(0.0, deadline - time.monotonic())))
        except Exception:
            results.append(None)
    return results


_POOL: list[ThreadPoolExecutor] = []  # fan_out's threads outside gevent, made once
_POOL_MADE = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    with _POOL_MADE:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(32, thread_name_prefix="fan-out"))
        return _POOL[0]
