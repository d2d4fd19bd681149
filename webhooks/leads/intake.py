"""The lead path (DESIGN.md "Lead path"): authenticate the publisher, check the lead, claim
its id, route it, answer, and hand the settlement to the ledger. No Flask here: the view
passes the request's parts in and sends back what `Intake.take` returns."""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from webhooks import metrics
from webhooks.caps import leases
from webhooks.errors import Conflict, Forbidden, Unauthorized, Unavailable, ValidationError
from webhooks.leads import settlement
from webhooks.leads.buyers import BuyerRule
from webhooks.leads.catalog import Snapshot
from webhooks.leads.delivery import ACCEPTED, UNKNOWN
from webhooks.leads.publishers import PublisherRule, key_hash
from webhooks.leads.routing import Offer, Outcome, Router, attempt_record, candidates, idempotency_key
from webhooks.leads.settlement import Journal
from webhooks.storage import claims, keys
from webhooks.storage.redis import REDIS_DOWN, Store
from webhooks.validate import is_id

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


@dataclass
class Intake:
    """Everything the lead path needs, built once per process by create_app."""

    store: Store  # caps, leases, breakers, lead claims
    settle: Store  # the settlement queue (the same Store unless RQ has a Redis of its own)
    router: Router
    journal: Journal
    buyer_timeout_ms: int
    replay_ttl_s: int
    breaker_failures: int
    breaker_cooldown_ms: int
    claim_margin_ms: int = 10_000
    recovery_window_ms: int = 900_000

    def take(self, snapshot: Snapshot, publisher: PublisherRule, lead_id: str, lead: dict,
             payload: str, received_at: datetime, request_id: str | None) -> str:
        """Route one lead; return the answer's JSON text (a replay returns the first answer
        with "replayed": true). Raises Conflict (in_flight) while another request routes the
        same lead id, Unavailable while caps are rebuilt or Redis is down."""
        now = datetime.now(timezone.utc)
        buyers, skipped = candidates(snapshot.buyers, lead.get("state"), publisher.id, now, snapshot.inactive)
        claim_ttl = self.claim_margin_ms + max(1, len(buyers)) * (self.buyer_timeout_ms + 100)
        attempt_key = keys.lead_attempt(publisher.id, lead_id)
        claim, held, attempt = claims.claim_reading(self.store, keys.lead_claim(publisher.id, lead_id), claim_ttl,
                                                    claims.new_token(claims.ROUTING), attempt_key)
        if claim is None:
            if held.startswith(claims.ROUTING):
                raise Conflict("this lead_id is being routed by another request; retry", code="in_flight")
            return json.dumps({**json.loads(held), "replayed": True})

        lease_ttl_ms = claim_ttl + self.recovery_window_ms
        try:
            if attempt is not None:
                # The request that held this claim died while offering the lead to a buyer.
                outcome = self._recover(json.loads(attempt), snapshot, publisher, lead_id, lead, lease_ttl_ms)
            else:
                outcome = self.router.route(buyers, publisher, lead_id, lead, now, attempt_key, lease_ttl_ms,
                                            skipped)
        except BaseException:
            self._give_up(claim, attempt_key)
            raise
        if outcome.status == "unsold" and outcome.waiting_for_rebuild:
            self._give_up(claim, attempt_key)
            raise Unavailable("buyer caps are being rebuilt after a Redis data loss; retry shortly")

        answer = json.dumps({"lead_id": lead_id, "status": outcome.status, "buyer_id": outcome.buyer_id,
                             "price": None if outcome.price is None else f"{outcome.price:.2f}",
                             "attempts": outcome.attempts})
        item = settlement.make_item(publisher, lead_id, outcome, payload, received_at, request_id)
        self._finish(claim, attempt_key, outcome, answer, item)
        return answer

    def _recover(self, note: dict, snapshot: Snapshot, publisher: PublisherRule, lead_id: str, lead: dict,
                 lease_ttl_ms: int) -> Outcome:
        """Offer the lead again to the one buyer a dead request was offering it to, with the
        same Idempotency-Key, on the same reservation. Accepted: sold to that buyer. Anything
        else, or a reservation that is gone: unsold, that attempt `unknown`, flagged for
        review; its slot stays taken until reconciliation. Never another buyer: the first
        may hold the lead already."""
        buyer_id = note["buyer_id"]
        lease = leases.Lease(buyer_id, note["lease_id"], tuple(note["counters"]), dedupe=tuple(note.get("dedupe", ())))
        state, reserved_us = leases.take_over(self.store, lease, lease_ttl_ms)
        out = Outcome(attempts=list(note.get("attempts", [])))
        rule = next((b for b in snapshot.buyers if b.id == buyer_id), None)  # switched off since: no
        offer = Offer(rule or BuyerRule(buyer_id, note["url"], 0, Decimal(note["price"]), 0, timezone.utc, (),
                                        frozenset(), frozenset(), None),
                      Decimal(note["price"]), None if note.get("bid") is None else Decimal(note["bid"]),
                      note.get("ping"))
        outcome, ms = UNKNOWN, 0
        if state != "gone" and rule is not None:
            outcome, ms = self.router.deliverer.deliver(
                note["url"], offer.body(lead_id, publisher.id, lead, json.dumps(lead, separators=(",", ":"))),
                idempotency_key(publisher.id, lead_id, buyer_id), rule.delivery)
        if outcome == ACCEPTED:
            out.attempts.append(attempt_record(offer, ACCEPTED, ms))
            out.status, out.buyer_id, out.price = "sold", buyer_id, Decimal(note["price"])
            out.sold_at = datetime.fromisoformat(note["at"])  # the windows the lease counted in
            out.lease = leases.Lease(buyer_id, lease.lease_id, lease.counters, reserved_us=reserved_us,
                                     dedupe=lease.dedupe)
            log.warning("lead %s:%s re-offered to %s after its routing died: accepted",
                        publisher.id, lead_id, buyer_id)
        else:
            out.attempts.append(attempt_record(offer, UNKNOWN, ms))
            log.warning("lead %s:%s left unsold for review: its routing died while offering it to %s, "
                        "who did not confirm it (reservation %s, answer %s)",
                        publisher.id, lead_id, buyer_id, state, outcome)
        metrics.attempt(buyer_id, out.attempts[-1]["outcome"], ms or None)
        return out

    def _give_up(self, claim: claims.Claim, attempt_key: str) -> None:
        """Let the publisher retry from scratch: no buyer holds the lead (any attempt was
        refunded), so free the claim and its attempt note."""
        try:
            pipe = self.store.redis.pipeline(transaction=False)
            self.store.queue(pipe, self.store.release_claim, [claim.key], [claim.token])
            pipe.delete(attempt_key)
            pipe.execute()
        except REDIS_DOWN:
            pass  # both expire; a retry may find the note and end the lead unsold for review

    def _finish(self, claim: claims.Claim, attempt_key: str, outcome: Outcome, answer: str, item: dict) -> None:
        """One round trip: confirm the lease, remember the answer, forget the attempt note,
        queue the settlement."""
        try:
            pipe = self.store.redis.pipeline(transaction=False)
            if outcome.lease is not None:
                leases.finish_in(self.store, pipe, outcome.lease, ACCEPTED,
                                 breaker_failures=self.breaker_failures,
                                 breaker_cooldown_ms=self.breaker_cooldown_ms)
            pipe.set(claim.key, answer, ex=self.replay_ttl_s)
            pipe.delete(attempt_key)
            if self.settle is not self.store:
                pipe.execute()
                pipe = None
            self.journal.push(item, pipe)
        except REDIS_DOWN:
            # The buyer has the lead: the answer stands, and the ledger gets it the slow way.
            # An unconfirmed lease just expires; its slot stays counted, as the sale is.
            settlement.settle_directly(item)
