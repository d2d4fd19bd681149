"""The lead path (docs/architecture.md "A lead"): authenticate the publisher, check the lead, claim
its id, route it, answer, and hand the settlement to the ledger. No Flask here: the view
passes the request's parts in and sends back what `Intake.take` returns."""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NoReturn

from webhooks.caps import leases, rebuild
from webhooks.caps.dedupe import consumer_keys
from webhooks.errors import Conflict, Forbidden, PublisherCapReached, Unauthorized, Unavailable, ValidationError
from webhooks.leads import answers, recovery, settlement
from webhooks.leads.catalog import Snapshot
from webhooks.leads.context import LeadContext
from webhooks.leads.delivery import Deliverer
from webhooks.leads.publishers import PublisherRule, cap_counters, cap_windows, key_hash
from webhooks.leads.routing import Offer, Outcome, Router, attempt_note, candidates
from webhooks.leads.settlement import Journal, Settlement
from webhooks.storage import claims, keys
from webhooks.storage.redis import REDIS_DOWN, Store
from webhooks.storage.scripts import LeadClaim
from webhooks.storage.states import ClaimOutcome, LeadStatus
from webhooks.validate import cents, is_id

if TYPE_CHECKING:
    from webhooks.config import Config

log = logging.getLogger(__name__)

CODE = "invalid_lead"


def authenticate(snapshot: Snapshot, authorization: str) -> PublisherRule:
    """The active publisher whose API key is the bearer token of `authorization` (the scheme
    name in any case: `bearer`, `Bearer`, `BEARER`)."""
    from webhooks.validate import bearer

    api_key = bearer(authorization)
    if not api_key or len(authorization) > 300:
        raise Unauthorized("missing bearer API key")
    publisher = snapshot.publishers_by_key.get(key_hash(api_key))
    if publisher is None:
        raise Unauthorized("unknown API key")
    if not publisher.active:
        raise Forbidden("publisher is inactive", code="publisher_inactive")
    return publisher


def test_flag(lead: dict) -> bool:
    """Whether a posted lead asks to be a test lead (`"test": true`); the field is taken out
    of the lead (a buyer never sees it). Anything but true or false is 400."""
    flag = lead.pop("test", False)
    if not isinstance(flag, bool):
        raise ValidationError(CODE, "test", "must be true or false")
    return flag


def parse_lead(body: Any) -> tuple[str, dict]:
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


def _replay(held: str | None, publisher_id: str, lead_id: str) -> str:
    """The answer for a request that does not hold the lead's claim: the first answer with
    "replayed": true (leads/answers.py; its attempts from the ledger when the claim left them
    to it), or Conflict (in_flight) while another request routes the lead (or the claim is
    gone, as it is between an expiry and the next claim, or the ledger does not hold those
    attempts yet)."""
    if held is None or held.startswith(claims.ROUTING):
        raise Conflict("this lead_id is being routed by another request; retry", code="in_flight")
    try:
        answer = answers.recall(held, lead_id, lambda: _ledger_attempts(publisher_id, lead_id))
    except answers.AttemptsPending:
        raise Conflict("this lead's answer is being written to the ledger; retry", code="in_flight") from None
    return json.dumps({**answer, "replayed": True})


def _ledger_attempts(publisher_id: str, lead_id: str) -> list[dict] | None:
    """A settled lead's attempts as its answer gave them; None while the ledger lacks it."""
    from webhooks.leads.ledger import answer_for
    from webhooks.storage.db import UNAVAILABLE_ERRORS, db

    try:
        with db.connection_context():
            found = answer_for(publisher_id, lead_id)
    except UNAVAILABLE_ERRORS:
        raise Unavailable("the lead ledger is unreachable; retry shortly") from None
    return None if found is None else found["attempts"]


@dataclass
class Intake:
    """Everything the lead path needs, built once per process by create_app."""

    store: Store  # caps, leases, breakers, lead claims
    settle: Store  # the settlement queue (the same Store unless RQ has a Redis of its own)
    router: Router
    journal: Journal
    settlement: Settlement  # how a lead ends (settlement.end_lead), through `journal`
    buyer_timeout_ms: int
    replay_ttl_s: int
    claim_margin_ms: int = 10_000
    recovery_window_ms: int = 900_000
    _rebuilds_started: set[int] = field(default_factory=set)  # memory marks whose rebuilds were asked for

    @classmethod
    def build(cls, cfg: Config, store: Store, settle: Store, journal: Journal) -> Intake:
        """The lead path of one process, from its config and stores."""
        router = Router(
            store,
            settle.redis,
            Deliverer(cfg.buyer_timeout_ms),
            cfg.buyer_timeout_ms,
            cfg.breaker_failures,
            cfg.breaker_cooldown_ms,
            cfg.ping_timeout_ms,
            cfg.ping_max_bid,
        )
        ending = Settlement(store, settle, journal.push, router.breaker, cfg.lead_replay_ttl_s)
        return cls(
            store,
            settle,
            router,
            journal,
            ending,
            cfg.buyer_timeout_ms,
            cfg.lead_replay_ttl_s,
            cfg.lead_claim_margin_ms,
            cfg.lead_recovery_window_ms,
        )

    def take(
        self,
        snapshot: Snapshot,
        publisher: PublisherRule,
        lead_id: str,
        lead: dict,
        payload: str,
        received_at: datetime,
        request_id: str | None,
        test: bool = False,
    ) -> str:
        """Route one lead; return the answer's JSON text (a replay returns the first answer
        with "replayed": true). Raises Conflict (in_flight) while another request routes the
        same lead id, Unavailable while caps are rebuilt or Redis is down. A `test` lead is
        claimed and answered like any other (a replay returns its answer) but only tried out
        (Router.try_out): nothing reserved, posted, earned or counted."""
        now = datetime.now(timezone.utc)
        started = time.monotonic()
        buyers, skipped = candidates(snapshot.buyers, lead, publisher.id, now, snapshot.inactive)
        claim_ttl = self.claim_margin_ms + max(1, len(buyers)) * (self.buyer_timeout_ms + 100)
        ctx = LeadContext(
            publisher,
            lead_id,
            lead,
            payload,
            now,
            request_id,
            claims.new_token(claims.ROUTING),
            claim_ttl,
            claim_ttl + self.recovery_window_ms,
            started + claim_ttl / 1000,
            test,
            () if test else cap_counters(publisher, now),  # a test lead counts in no cap
        )  # the claim lives at least this long (set after `started`)
        plan = None if test else self.router.plan(buyers, publisher)
        got, first = self._claim(ctx, plan[0] if plan else None)
        if got.outcome is ClaimOutcome.WAIT:
            self._refuse_after_claim_loss(ctx, got.memory_mark, snapshot)
        if got.outcome is ClaimOutcome.HELD:
            return _replay(got.held, publisher.id, lead_id)
        if got.outcome is ClaimOutcome.CAPPED:
            self._refuse_over_cap(ctx, got.full)
        if got.dead_note is not None:  # that lead was counted when its dead request claimed it
            ctx = replace(ctx, caps=())
        if got.dead_note is None and claims.memory_gap(got.memory_mark, int(now.timestamp() * 1000), self.replay_ttl_s):
            settled = self._settled_answer(ctx, first)
            if settled is not None:
                return json.dumps({**json.loads(settled), "replayed": True})

        try:
            if got.dead_note is not None:
                # The request that held this claim died while offering the lead to a buyer.
                outcome = recovery.reoffer(
                    self.store, self.router.deliverer, snapshot.buyers, ctx, json.loads(got.dead_note)
                )
            elif test:
                outcome = self.router.try_out(ctx, buyers, skipped)
            else:
                outcome = self.router.route(ctx, buyers, skipped, plan, first)
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
                publisher.id,
                lead_id,
            )
            self._give_up(ctx, forget_note=time.monotonic() < ctx.deadline)
            raise Unavailable("this request ran out of time; retry")
        if outcome.status == LeadStatus.UNSOLD and outcome.waiting_for_rebuild:
            self._give_up(ctx, forget_note=time.monotonic() < ctx.deadline)
            raise Unavailable(
                "buyer caps are being rebuilt after a Redis data loss; retry shortly",
                retry_after_s=math.ceil(self.buyer_timeout_ms / 1000 + rebuild.SETTLE_MARGIN_S),
            )

        item = settlement.make_item(
            publisher, lead_id, outcome, payload, received_at, request_id, test and got.dead_note is None
        )
        answer = json.dumps(settlement.answer_of(item))
        if time.monotonic() > ctx.deadline - claims.LATE_S:
            # The claim may have expired under a stalled process: write the answer first, and
            # settle only if it was ours to write (an expired claim nobody took is).
            holder = self._answer(ctx, answers.remember(settlement.answer_of(item)))
            if holder is not None:
                return self._end_lost(ctx, outcome, answer, item, holder)
            settlement.end_lead(self.settlement, ctx.token, outcome, item, keep_claim=True)
            return answer
        settlement.end_lead(self.settlement, ctx.token, outcome, item)
        return answer

    def _answer(self, ctx: LeadContext, answer: str) -> str | None:
        """Write the answer (as leads/answers.py remembers it) into the lead's claim unless another
        request holds it now (lua/answer_lead.lua); None when written, else what the claim holds."""
        try:
            return self.store.answer_lead(ctx.key, ctx.token, answer, self.replay_ttl_s).held
        except REDIS_DOWN:
            return None  # cannot tell: end as usual (the settlement goes to the database)

    def _end_lost(self, ctx: LeadContext, outcome: Outcome, answer: str, item: dict, holder: str) -> str:
        """The claim expired while this request routed (its process stalled) and another
        request holds it now. A sale stands (the buyer has the lead: it is confirmed and
        settled, the claim left alone); anything else is forgotten, so the ledger and the
        publisher get the other request's answer."""
        log.error(
            "lead %s:%s: the claim expired while it was routed (a stalled process); outcome %s%s",
            item["publisher_id"],
            item["lead_id"],
            outcome.status,
            " to " + str(outcome.buyer_id) if outcome.buyer_id else "",
        )
        if outcome.lease is not None:
            settlement.end_lead(self.settlement, ctx.token, outcome, item, keep_claim=True)
            return answer
        return _replay(holder, ctx.publisher.id, ctx.lead_id)

    def _settled_answer(self, ctx: LeadContext, first: leases.Reservation | None) -> str | None:
        """Redis lost the publisher's replay memory lately (its mark is young): ask the
        ledger before routing. A settled lead's answer is put back as the claim's value and
        returned (its first reservation withdrawn); None when the ledger has no such lead.
        Unavailable when the ledger cannot say: routing blind could sell the lead twice.
        One piece of the recovery from a Redis data loss: see docs/architecture.md "When Redis loses its data"."""
        from webhooks.leads.ledger import answer_for
        from webhooks.storage.db import UNAVAILABLE_ERRORS, db

        try:
            with db.connection_context():
                found = answer_for(ctx.publisher.id, ctx.lead_id)
        except UNAVAILABLE_ERRORS:
            self._withdraw(first)
            self._give_up(ctx, forget_note=True)
            raise Unavailable(
                "the lead ledger is unreachable and Redis lost its replay memory lately; retry shortly"
            ) from None
        if found is None:
            return None
        answer = json.dumps(found)
        self._withdraw(first)
        try:
            with self.store.batch() as b:  # EVAL: no EVALSHA miss on a Redis that just lost its data
                b.answer_lead(ctx.key, ctx.token, answers.remember(found), self.replay_ttl_s)
        except REDIS_DOWN:
            pass  # the answer is known; the claim expires and the next retry reads the ledger again
        log.warning("lead %s:%s answered from the ledger: Redis had lost its answer", ctx.publisher.id, ctx.lead_id)
        return answer

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
                    rebuild.request(self.store, self.router.settle_r, buyer, self.buyer_timeout_ms)
            except REDIS_DOWN:
                self._rebuilds_started.discard(mark_ms)  # the next waiting lead tries again
                return

    def _withdraw(self, reservation: leases.Reservation | None) -> None:
        """Give back the speculative first reservation, if one was granted."""
        if reservation is not None and reservation.lease is not None:
            leases.withdraw(self.store, reservation.lease)

    def _claim(self, ctx: LeadContext, offer: Offer | None) -> tuple[LeadClaim, leases.Reservation | None]:
        """Claim the lead id and, in the same round trip, reserve its first buyer and note the
        attempt (lua/claim_lead.lua writes the note only when the claim is ours and no dead
        request left one). Returns the claim's answer and the first reservation. The
        reservation is made before the claim's answer is known: when the claim is not ours,
        or a dead request's offer must be finished first, it is withdrawn again (a round trip
        more on that path only)."""
        now_ms = int(ctx.now.timestamp() * 1000)
        if offer is None or self.store.cap_wait.replicas:  # the WAIT path reserves on its own connection
            got = self.store.claim_lead(
                ctx.key, ctx.token, ttl_ms=ctx.claim_ttl_ms, now_ms=now_ms, note_ttl_ms=ctx.lease_ttl_ms, caps=ctx.caps
            )
            return got, None
        buyer = offer.buyer
        call = leases.prepare(
            buyer,
            ctx.now,
            lease_ttl_ms=ctx.lease_ttl_ms,
            probe_ttl_ms=self.router.probe_ttl_ms,
            consumer=consumer_keys(buyer.id, buyer.dedupe_fields, ctx.lead),
            price_minor=cents(offer.price),
            note_key=ctx.attempt_key,
            publisher_id=ctx.publisher.id,
        )
        note = attempt_note(ctx.attempt_key, offer, ctx.now, [], ctx.lease_ttl_ms, ctx.ref).value(call.lease)
        with self.store.batch() as b:
            claimed = b.claim_lead(
                ctx.key,
                ctx.token,
                ttl_ms=ctx.claim_ttl_ms,
                now_ms=now_ms,
                note=note,
                note_ttl_ms=ctx.lease_ttl_ms,
                caps=ctx.caps,
            )
            reserved = call.queue(b)
        got, first = claimed.value, reserved.value
        if got.outcome is not ClaimOutcome.CLAIMED or got.dead_note is not None:
            self._withdraw(first)
            return got, None
        return got, first

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
