"""The lead path (docs/architecture.md "A lead"): authenticate the publisher, check the lead, claim
its id, route it, answer, and hand the settlement to the ledger. No Flask here: the view
passes the request's parts in, sends back the text of the `LeadAnswer` it gets and counts it by
its outcome."""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, TypeVar

from webhooks.caps import rebuild
from webhooks.errors import Conflict, Forbidden, PublisherCapReached, Unauthorized, Unavailable, ValidationError
from webhooks.formats.validate import is_id
from webhooks.leads.path import answers, precheck, recovery, settlement
from webhooks.leads.path.context import LeadContext
from webhooks.leads.path.routing import Outcome, Reservation, Route, Router
from webhooks.leads.path.settlement import Journal, Settlement
from webhooks.leads.posting.delivery import Deliverer
from webhooks.leads.rules import consent, earnings
from webhooks.leads.rules.catalog import Snapshot
from webhooks.leads.rules.publishers import Buckets, PublisherRule, Toll, cap_counters, cap_windows, key_hash, refuse
from webhooks.leads.rules.quality import checked
from webhooks.leads.rules.suppression import SUPPRESSED
from webhooks.storage.live import claims, keys
from webhooks.storage.live.redis import REDIS_DOWN, Store
from webhooks.storage.live.scripts import LeadClaim
from webhooks.storage.states import ClaimOutcome, LeadStatus

if TYPE_CHECKING:
    from webhooks.config import Config

log = logging.getLogger(__name__)

CODE = "invalid_lead"
T = TypeVar("T")


def authenticate(snapshot: Snapshot, authorization: str) -> PublisherRule:
    """The active publisher whose API key is the bearer token of `authorization` (the scheme
    name in any case: `bearer`, `Bearer`, `BEARER`)."""
    from webhooks.formats.validate import bearer

    api_key = bearer(authorization)
    if not api_key or len(authorization) > 300:
        raise Unauthorized("missing bearer API key")
    publisher = snapshot.publishers_by_key.get(key_hash(api_key))
    if publisher is None:
        raise Unauthorized("unknown API key")
    if not publisher.active:
        raise Forbidden("publisher is inactive", code="publisher_inactive")
    return publisher


def test_flag(lead: dict[str, Any]) -> bool:
    """Whether a posted lead asks to be a test lead (`"test": true`); the field is taken out
    of the lead (a buyer never sees it). Anything but true or false is 400."""
    flag = lead.pop("test", False)
    if not isinstance(flag, bool):
        raise ValidationError(CODE, "test", "must be true or false")
    return flag


def parse_lead(body: Any) -> tuple[str, dict[str, Any]]:
    """(lead_id, the other fields) of a posted lead; a missing lead_id is generated."""
    if not isinstance(body, dict):
        raise ValidationError(CODE, "body", "must be a JSON object")
    lead = dict(body)
    lead_id = lead.pop("lead_id", None)
    if lead_id is None:
        lead_id = uuid.uuid4().hex
    elif not is_id(lead_id):
        raise ValidationError(CODE, "lead_id", "must match [A-Za-z0-9._-]{1,64}")
    if "state" in lead and not isinstance(lead["state"], str):
        raise ValidationError(CODE, "state", "must be a string")
    return lead_id, lead


class LeadAnswer(NamedTuple):
    """A lead's answer: its JSON text, and what it counts as in metrics.lead_answered."""

    text: str
    outcome: str  # "sold", "unsold", "test" (a test lead's) or "replayed"

    @classmethod
    def of(cls, answer: dict[str, Any]) -> LeadAnswer:
        """The answer a lead routed now was given (settlement.answer_of)."""
        return cls(json.dumps(answer), "test" if answer.get("test") else answer["status"])

    @classmethod
    def replayed(cls, answer: dict[str, Any]) -> LeadAnswer:
        """A first answer given again, marked "replayed": true."""
        return cls(json.dumps({**answer, "replayed": True}), "replayed")


def _replay(held: str | None, publisher_id: str, lead_id: str) -> LeadAnswer:
    """The answer for a request that does not hold the lead's claim: the first answer with
    "replayed": true (leads/path/answers.py; its attempts from the ledger when the claim left them
    to it), or Conflict (in_flight) while another request routes the lead (or the claim is
    gone, as it is between an expiry and the next claim, or the ledger does not hold those
    attempts yet)."""
    if held is None or held.startswith(claims.ROUTING):
        raise Conflict("this lead_id is being routed by another request; retry", code="in_flight")
    try:
        answer = answers.recall(held, lead_id, lambda: _ledger_attempts(publisher_id, lead_id))
    except answers.AttemptsPending:
        raise Conflict("this lead's answer is being written to the ledger; retry", code="in_flight") from None
    return LeadAnswer.replayed(answer)


def _ledger_attempts(publisher_id: str, lead_id: str) -> list[dict[str, Any]] | None:
    """A settled lead's attempts as its answer gave them; None while the ledger lacks it."""
    from webhooks.leads.accounting.ledger import ask_for_answer

    found = ask_for_answer(publisher_id, lead_id, "the lead ledger is unreachable; retry shortly")
    return None if found is None else found["attempts"]


class Claimed(NamedTuple):
    """What `Intake._claim` got: the claim's answer, the first offer's reservation, and an `epl`
    publisher's earnings (ready, per buyer)."""

    got: LeadClaim
    first: Reservation | None
    earned: tuple[bool, dict[str, earnings.Tally]] | None = None


class Admitted(NamedTuple):
    """A lead past its publisher's key, token bucket and field spec (`Intake.admit`)."""

    publisher: PublisherRule
    lead_id: str
    fields: dict[str, Any]  # normalised by the spec, lead_id and test taken out
    payload: str  # as the ledger keeps it
    test: bool  # the lead asked to be a test lead


@dataclass(frozen=True, kw_only=True)
class LeadRequest:
    """A POST /v1/leads as the view hands it over: the body is read only when asked for
    (after the publisher's token bucket), as strict JSON (`body`) and as text (`text`)."""

    authorization: str
    body: Callable[[], Any]
    text: Callable[[], str]
    received_at: datetime
    request_id: str | None


@dataclass(kw_only=True)
class Intake:
    """Everything the lead path needs, built once per process by create_app."""

    store: Store  # caps, leases, breakers, lead claims
    queue_redis: Store  # the settlement queue (the same Store unless RQ has a Redis of its own)
    router: Router
    journal: Journal
    settlement: Settlement  # how a lead ends (settlement.end_lead), through `journal`
    buyer_timeout_ms: int
    replay_ttl_s: int
    claim_margin_ms: int = 10_000
    recovery_window_ms: int = 900_000
    buckets: Buckets = field(default_factory=Buckets)  # the publishers' token buckets, as last seen
    _rebuilds_started: set[int] = field(default_factory=set)  # memory marks whose rebuilds were asked for

    @classmethod
    def build(cls, cfg: Config, store: Store, queue_redis: Store, journal: Journal) -> Intake:
        """The lead path of one process, from its config and stores."""
        router = Router(
            store=store,
            queue_redis=queue_redis.redis,
            deliverer=Deliverer(cfg.buyer_timeout_ms),
            buyer_timeout_ms=cfg.buyer_timeout_ms,
            breaker_failures=cfg.breaker_failures,
            breaker_cooldown_ms=cfg.breaker_cooldown_ms,
            ping_timeout_ms=cfg.ping_timeout_ms,
            max_bid=cfg.ping_max_bid,
            epl_prior_offers=cfg.epl_prior_offers,
            epl_half_life_days=cfg.epl_half_life_hours / 24,
            trustedform=consent.TrustedForm(
                api_base=cfg.trustedform_api_base,
                api_key=cfg.trustedform_api_key,
                timeout_ms=cfg.trustedform_timeout_ms,
            ),
        )
        ending = Settlement(
            store,
            queue_redis,
            journal.push,
            router.breaker,
            cfg.lead_replay_ttl_s,
            lookup_key=cfg.suppression_key.encode(),
        )
        return cls(
            store=store,
            queue_redis=queue_redis,
            router=router,
            journal=journal,
            settlement=ending,
            buyer_timeout_ms=cfg.buyer_timeout_ms,
            replay_ttl_s=cfg.lead_replay_ttl_s,
            claim_margin_ms=cfg.lead_claim_margin_ms,
            recovery_window_ms=cfg.lead_recovery_window_ms,
            buckets=Buckets(cfg.publisher_rate_limit),
        )

    def receive(self, snapshot: Snapshot, req: LeadRequest) -> LeadAnswer:
        """A posted lead, from the request to its answer: `admit` it, then `take`.
        Its token goes with its claim when the publisher's bucket was last seen full enough
        (leads/rules/publishers.py:Buckets); a request that ends before its claim takes it then
        (a 429 then replaces its answer, as it would have come first)."""
        publisher = authenticate(snapshot, req.authorization)
        toll = self.buckets.toll(publisher)
        try:
            lead = self._admit(publisher, req, toll)
            return self.take(
                snapshot,
                publisher=lead.publisher,
                lead_id=lead.lead_id,
                lead=lead.fields,
                payload=lead.payload,
                received_at=req.received_at,
                request_id=req.request_id,
                test=lead.test or lead.publisher.mode == "test",
                toll=toll,
            )
        finally:
            if toll.owed:
                self.buckets.throttle(self.store, publisher)

    def check(self, snapshot: Snapshot, req: LeadRequest) -> str:
        """A pre-ping (POST /v1/leads/check), from the request to its answer's JSON text:
        `admit`ted as a posted lead is, then only read (leads/path/precheck.py). A `test` flag
        is accepted and changes nothing."""
        lead = self._admit(authenticate(snapshot, req.authorization), req, Toll())
        now = datetime.now(timezone.utc)
        answer = precheck.check(
            self.router, snapshot, lead.publisher, lead.lead_id, lead.fields, now=now, replay_ttl_s=self.replay_ttl_s
        )
        return json.dumps(answer.view())

    def _admit(self, publisher: PublisherRule, req: LeadRequest, toll: Toll) -> Admitted:
        """What a post and a pre-ping both go through once the publisher is authenticated: its
        token bucket (before the body is read: a flood costs one round trip; unless the `toll`
        sends the token with the claim), parse, check against the publisher's field spec
        (leads/rules/quality.py)."""
        if toll.bucket is None:
            self.buckets.throttle(self.store, publisher)
        lead_id, lead = parse_lead(req.body())
        test = test_flag(lead)
        lead, payload = checked(publisher.spec, lead_id, lead, req.text())
        return Admitted(publisher, lead_id, lead, payload, test)

    def take(
        self,
        snapshot: Snapshot,
        *,
        publisher: PublisherRule,
        lead_id: str,
        lead: dict[str, Any],
        payload: str,
        received_at: datetime,
        request_id: str | None,
        test: bool = False,
        toll: Toll | None = None,
    ) -> LeadAnswer:
        """Route one lead; return its answer (a replay returns the first answer with
        "replayed": true). Raises Conflict (in_flight) while another request routes the
        same lead id, Unavailable while caps are rebuilt or Redis is down. A `test` lead is
        claimed and answered like any other (a replay returns its answer) but only tried out
        (Router.try_out): nothing reserved, posted, earned or counted."""
        now = datetime.now(timezone.utc)
        route = self.router.select(snapshot, publisher, lead, now, test)
        if route.suppressed:  # refused before anything is claimed, reserved, counted or stored
            return LeadAnswer.of({"lead_id": lead_id, "status": LeadStatus.UNSOLD.value, "reason": SUPPRESSED})
        ctx = self._context(
            publisher=publisher,
            lead_id=lead_id,
            lead=lead,
            payload=payload,
            now=now,
            request_id=request_id,
            test=test,
            route=route,
        )
        toll = toll or Toll()
        got, first, earned = self._claim(ctx, route, toll)
        if got.outcome is ClaimOutcome.THROTTLED:  # other processes took the bucket's last tokens
            assert toll.bucket is not None  # only a claim that carried the lead's token is throttled
            refuse(publisher.id, toll.bucket, got.wait_ms)
        early = self._claim_answer(ctx, got, first, snapshot)
        if early is not None:
            return early
        if got.dead_note is not None:  # that lead was counted when its dead request claimed it
            ctx = replace(ctx, caps=())
        elif earned is not None:
            ctx = replace(ctx, earned=self._earned(ctx, first, *earned))
        outcome = self._route(ctx, route, got.dead_note, first, snapshot)
        item = settlement.make_item(
            publisher=publisher,
            lead_id=lead_id,
            outcome=outcome,
            payload=payload,
            received_at=received_at,
            request_id=request_id,
            test=test and got.dead_note is None,
        )
        holder = settlement.end_in_time(self.settlement, ctx, outcome, item).holder
        if holder is not None:  # the claim expired under a stalled process: the holder's answer
            return _replay(holder, publisher.id, lead_id)
        return LeadAnswer.of(settlement.answer_of(item))

    def _context(
        self,
        *,
        publisher: PublisherRule,
        lead_id: str,
        lead: dict[str, Any],
        payload: str,
        now: datetime,
        request_id: str | None,
        test: bool,
        route: Route,
    ) -> LeadContext:
        """The lead's context; its claim lives for the worst case of its route's waterfall."""
        claim_ttl = self.claim_margin_ms + max(1, len(route.buyers)) * (self.buyer_timeout_ms + 100)
        return LeadContext(
            publisher=publisher,
            lead_id=lead_id,
            lead=lead,
            payload=payload,
            now=now,
            request_id=request_id,
            token=claims.new_token(claims.ROUTING),
            claim_ttl_ms=claim_ttl,
            lease_ttl_ms=claim_ttl + self.recovery_window_ms,
            deadline=time.monotonic() + claim_ttl / 1000,  # the claim lives at least this long
            test=test,
            caps=() if test else cap_counters(publisher, now),  # a test lead counts in no cap
            consumers=route.consumers,
        )

    def _claim_answer(
        self, ctx: LeadContext, got: LeadClaim, first: Reservation | None, snapshot: Snapshot
    ) -> LeadAnswer | None:
        """What the claim's outcome answers before any routing: a replay, a refusal (raised), or
        the ledger's answer when Redis lost the publisher's replay memory lately; None: route."""
        if got.outcome is ClaimOutcome.WAIT:
            self._refuse_after_claim_loss(ctx, got.memory_mark, snapshot)
        if got.outcome is ClaimOutcome.HELD:
            return _replay(got.held, ctx.publisher.id, ctx.lead_id)
        if got.outcome is ClaimOutcome.CAPPED:
            self._refuse_over_cap(ctx, got.full)
        now_ms = int(ctx.now.timestamp() * 1000)
        if got.dead_note is None and claims.memory_gap(got.memory_mark, now_ms, self.replay_ttl_s):
            settled = self._settled_answer(ctx, first)
            if settled is not None:
                return LeadAnswer.replayed(settled)
        return None

    def _route(
        self, ctx: LeadContext, route: Route, dead_note: str | None, first: Reservation | None, snapshot: Snapshot
    ) -> Outcome:
        """The lead's outcome: re-offered to the buyer a dead request was offering it to, tried
        out (a test lead) or routed. Unavailable (the claim freed for a retry) when this
        process stalled or buyer caps are being rebuilt."""
        try:
            if dead_note is not None:
                # The request that held this claim died while offering the lead to a buyer.
                outcome = recovery.reoffer(
                    self.store, self.router.deliverer, snapshot.buyers, ctx, json.loads(dead_note)
                )
            elif ctx.test:
                outcome = self.router.try_out(ctx, route)
            else:
                outcome = self.router.route(ctx, route, first)
        except BaseException:
            # Killed (a deploy's graceful timeout) or failed mid-routing: a buyer may hold the
            # lead, so the attempt note stays for the retry (every refund already deleted it).
            self._give_up(ctx, forget_note=False)
            raise
        if outcome.out_of_time:
            # This process stalled: the claim may be another request's by now, and so may the
            # attempt note. No buyer holds the lead from us (each earlier offer was settled).
            log.warning(
                "lead %s:%s not offered further: its claim was about to expire (a stalled process)",
                ctx.publisher.id,
                ctx.lead_id,
            )
            self._give_up(ctx, forget_note=time.monotonic() < ctx.deadline)
            raise Unavailable("this request ran out of time; retry")
        if outcome.status == LeadStatus.UNSOLD and outcome.waiting_for_rebuild:
            self._give_up(ctx, forget_note=time.monotonic() < ctx.deadline)
            raise Unavailable(
                "buyer caps are being rebuilt after a Redis data loss; retry shortly",
                retry_after_s=math.ceil(self.buyer_timeout_ms / 1000 + rebuild.SETTLE_MARGIN_S),
            )
        return outcome

    def _settled_answer(self, ctx: LeadContext, first: Reservation | None) -> dict[str, Any] | None:
        """Redis lost the publisher's replay memory lately (its mark is young): ask the
        ledger before routing. A settled lead's answer is put back as the claim's value and
        returned (its first reservation withdrawn); None when the ledger has no such lead.
        Unavailable when the ledger cannot say: routing blind could sell the lead twice.
        One piece of the recovery from a Redis data loss: see docs/architecture.md "When Redis loses its data"."""
        from webhooks.leads.accounting.ledger import ask_for_answer

        try:
            found = ask_for_answer(ctx.publisher.id, ctx.lead_id, answers.LEDGER_UNREACHABLE_AFTER_LOSS)
        except Unavailable:
            self.router.withdraw(first)
            self._give_up(ctx, forget_note=True)
            raise
        if found is None:
            return None
        self.router.withdraw(first)
        try:
            with self.store.batch() as b:  # EVAL: no EVALSHA miss on a Redis that just lost its data
                b.answer_lead(ctx.key, ctx.token, answers.remember(found), self.replay_ttl_s)
        except REDIS_DOWN:
            pass  # the answer is known; the claim expires and the next retry reads the ledger again
        log.warning("lead %s:%s answered from the ledger: Redis had lost its answer", ctx.publisher.id, ctx.lead_id)
        return found

    def _refuse_after_claim_loss(self, ctx: LeadContext, mark_ms: int, snapshot: Snapshot) -> NoReturn:
        """Raise Unavailable: Redis lost its claims at about `mark_ms`, and a request that
        claimed this lead before then may still be offering it to a buyer; nothing here can
        tell (its claim and note went with the data). Until such a request has ended, one
        claim's life after the loss (the claim it held was as long as this one, for the same
        buyers), a lead whose claim holds no answer is not claimed (lua/claim_lead.lua) and
        is refused here (503, Retry-After), before the ledger is asked: the database is
        spared while every publisher retries at once. After it, the lead is settled, answered
        (the request that held it writes its answer into the empty claim,
        lua/answer_lead.lua) or was never routed. See docs/architecture.md "When Redis loses its data"."""
        left_ms = max(1, mark_ms + ctx.claim_ttl_ms - int(ctx.now.timestamp() * 1000))
        self._start_rebuilds(snapshot, mark_ms)
        raise Unavailable(
            "Redis lost its lead claims lately; requests routing this lead before then may "
            "still be running: retry after Retry-After",
            retry_after_s=math.ceil(left_ms / 1000),
        )

    def _start_rebuilds(self, snapshot: Snapshot, mark_ms: int) -> None:
        """Once per loss, publisher and process: start the counter rebuild of every buyer whose counters
        are not trusted, so that it runs during the wait instead of after it (no lead is
        routed meanwhile, so no reservation would ask for it)."""
        if mark_ms in self._rebuilds_started:
            return
        if len(self._rebuilds_started) > 1000:  # one mark per publisher and loss
            self._rebuilds_started.clear()
        self._rebuilds_started.add(mark_ms)
        for buyer in snapshot.buyers:
            try:
                if not self.store.redis.exists(keys.ready(buyer.id)):
                    rebuild.request(self.store, self.router.queue_redis, buyer, self.buyer_timeout_ms)
            except REDIS_DOWN:
                self._rebuilds_started.discard(mark_ms)  # the next waiting lead tries again
                return

    def _claim(self, ctx: LeadContext, route: Route, toll: Toll) -> Claimed:
        """Claim the lead id (taking its token when the `toll` says so) and, in the same round
        trip, reserve its first buyer and note the attempt (routing's `opening`;
        lua/claim_lead.lua writes the note only when the claim is ours and no dead request left
        one), or for an `epl` publisher read its buyers' earnings (leads/rules/earnings.py).
        Returns the claim's answer, the first reservation, withdrawn again (a round trip more on
        that path only) when the claim is not ours, its token was refused, or a dead request's
        offer must be finished first, and the earnings read."""
        opening = self.router.opening(ctx, route)
        bucket = toll.take()
        epl = ctx.publisher.routing == "epl" and not ctx.test
        recent = self.router.recent
        read_now = epl and recent.due(ctx.publisher.id, time.monotonic())

        def claim(on: Callable[..., T]) -> T:  # Store.claim_lead, or a batch's
            return on(
                ctx.key,
                ctx.token,
                ttl_ms=ctx.claim_ttl_ms,
                now_ms=int(ctx.now.timestamp() * 1000),
                note=opening.note if opening else "",
                note_ttl_ms=ctx.lease_ttl_ms,
                caps=ctx.caps,
                bucket=bucket,
            )

        earned = recent.get(ctx.publisher.id) if epl else None
        if opening is None and not read_now:
            got = claim(self.store.claim_lead)
            self._saw(ctx, got)
            return Claimed(got, None, earned)
        with self.store.batch() as b:
            claimed = claim(b.claim_lead)
            reserved = opening.queue(b) if opening is not None else None
            read = earnings.read_in(b, ctx.publisher.id, ctx.now, ctx.publisher.epl_window_days) if read_now else None
        got, first = claimed.value, None if reserved is None else reserved.value
        if read is not None:
            days = earnings.days_read(d.value for d in read[1])
            earned = (bool(read[0].value), earnings.weigh(days, self.router.epl_half_life_days))
            recent.put(ctx.publisher.id, *earned, time.monotonic())
        self._saw(ctx, got)
        if got.outcome is not ClaimOutcome.CLAIMED or got.dead_note is not None:
            self.router.withdraw(first)
            return Claimed(got, None, earned)
        return Claimed(got, first, earned)

    def _earned(
        self, ctx: LeadContext, first: Reservation | None, ready: bool, tallies: dict[str, earnings.Tally]
    ) -> dict[str, earnings.Tally]:
        """An `epl` lead's earnings as this process last read them (with this claim, or within
        READ_EVERY_S); Unavailable (its claim freed for a retry, its first reservation given back)
        while Redis does not know them (after a data loss): fail closed, as caps do, while a
        thread of this process rebuilds them from the ledger."""
        if ready:
            return tallies
        publisher = ctx.publisher
        self.router.withdraw(first)
        try:
            earnings.request_rebuild(self.store.redis, publisher.id, publisher.epl_window_days)
        finally:
            self._give_up(ctx, forget_note=True)
        raise Unavailable(
            "this publisher's buyer earnings are being rebuilt after a Redis data loss; retry shortly",
            retry_after_s=earnings.RETRY_AFTER_S,
        )

    def _saw(self, ctx: LeadContext, got: LeadClaim) -> None:
        """Note what the claim saw of the publisher's bucket (when it took a token)."""
        if got.outcome is ClaimOutcome.THROTTLED:
            self.buckets.saw(ctx.publisher.id, 0)
        elif got.tokens >= 0:
            self.buckets.saw(ctx.publisher.id, got.tokens)

    def _refuse_over_cap(self, ctx: LeadContext, full: int) -> NoReturn:
        """429 publisher_cap_reached: the publisher's cap counter `full` (1-based, of ctx.caps,
        built from its caps in order) is full; nothing was claimed or counted. Retry-After: to
        that cap's next window."""
        name, limit = ctx.publisher.caps[full - 1]
        _window, end = cap_windows(ctx.now)[name]
        raise PublisherCapReached(
            f"this publisher's {name} cap of {limit} leads is reached; retry in the next window",
            retry_after_s=math.ceil((end - ctx.now).total_seconds()),
        )

    def _give_up(self, ctx: LeadContext, forget_note: bool) -> None:
        """Free the claim so the publisher can retry, and with `forget_note` its attempt note
        too (only when no buyer can hold the lead: every attempt was refunded) and its count in
        the publisher's caps (its retry, claiming afresh, counts it again; a retry that finds
        the note does not, so the count stays while the note does)."""
        try:
            with self.store.batch() as b:
                b.release_claim(ctx.key.claim, ctx.token)
                if forget_note:
                    b.delete(ctx.attempt_key)
                    # only in the window it was counted in (a rolled-over key is gone: DECR would
                    # leave a -1 without expiry)
                    current = {c.key for c in cap_counters(ctx.publisher, datetime.now(timezone.utc))}
                    for counter in ctx.caps:
                        if counter.key in current:
                            b.decr(counter.key)
        except REDIS_DOWN:
            pass  # both expire; a retry may find the note and end the lead unsold for review
