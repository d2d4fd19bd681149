"""The waterfall: static filters in memory, an atomic lease per buyer, delivery, confirm or
refund, next buyer. Holds no Flask state; the view hands it what it needs."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from webhooks import metrics
from webhooks.caps import leases, rebuild
from webhooks.caps.dedupe import consumer_keys
from webhooks.leads.buyers import BuyerRule
from webhooks.leads.delivery import ACCEPTED, CIRCUIT_OPEN, Deliverer
from webhooks.leads.publishers import PublisherRule
from webhooks.storage.redis import Store

log = logging.getLogger(__name__)

LEASE_MARGIN_MS = 10_000


@dataclass
class Outcome:
    status: str = "unsold"
    buyer_id: str | None = None
    price: Decimal | None = None
    sold_at: datetime | None = None
    lease: leases.Lease | None = None
    attempts: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # the routing trace: buyers not attempted, why
    waiting_for_rebuild: bool = False  # a buyer was skipped because its counters are rebuilding


def candidates(buyers: tuple[BuyerRule, ...], state: str | None, publisher_id: str, now: datetime,
               inactive: tuple[str, ...] = ()) -> tuple[list[BuyerRule], list[dict]]:
    """The buyers the static filters pass, in order, and the trace of those they refuse
    (inactive buyers first)."""
    passed, skipped = [], [{"buyer_id": b, "reason": "inactive"} for b in inactive]
    for b in buyers:
        reason = b.refusal(state, publisher_id, now)
        if reason is None:
            passed.append(b)
        else:
            skipped.append({"buyer_id": b.id, "reason": reason})
    return passed, skipped


def buyer_body(lead_id: str, publisher_id: str, price: Decimal | str, lead_json: str) -> bytes:
    """The default contract's post (API.md "What a buyer receives"), built without re-encoding
    the lead."""
    return ('{"lead_id":%s,"publisher_id":%s,"price":"%s","lead":%s}' % (
        json.dumps(lead_id), json.dumps(publisher_id), price, lead_json)).encode()


def idempotency_key(publisher_id: str, lead_id: str, buyer_id: str) -> str:
    return f"{publisher_id}:{lead_id}:{buyer_id}"


def attempt_note(attempt_key: str, buyer: BuyerRule, now: datetime, attempts: list[dict],
                 ttl_ms: int) -> leases.Note:
    """What a retry needs to offer the lead again to `buyer` alone if this request dies: where,
    at what price, the time whose windows the lease counts in, and the attempts before it."""
    return leases.Note(attempt_key, {"url": buyer.endpoint_url, "price": f"{buyer.price:.2f}",
                                     "at": now.isoformat(), "attempts": attempts}, ttl_ms)


@dataclass
class Router:
    """Everything the waterfall needs, built once per process."""

    store: Store  # caps, leases and breakers
    settle_r: object  # Redis holding unsettled sales (counted by a rebuild)
    deliverer: Deliverer
    buyer_timeout_ms: int
    breaker_failures: int
    breaker_cooldown_ms: int

    def route(self, buyers: list[BuyerRule], publisher: PublisherRule, lead_id: str, lead: dict,
              now: datetime, attempt_key: str, lease_ttl_ms: int, skipped: list[dict] | None = None) -> Outcome:
        """Offer the lead down the waterfall until a buyer accepts it. Each reservation writes,
        in its own round trip, which buyer and lease the lead is about to be offered to
        (`attempt_key`); a refund clears it again in its round trip. Leases live
        `lease_ttl_ms`: long enough for a retry to find the lease of a request that died."""
        out = Outcome(skipped=list(skipped or ()))
        lead_json = json.dumps(lead, separators=(",", ":"))
        probe_ttl_ms = self.buyer_timeout_ms + LEASE_MARGIN_MS
        for buyer in buyers:
            note = attempt_note(attempt_key, buyer, now, out.attempts, lease_ttl_ms)
            consumer = consumer_keys(buyer.id, buyer.dedupe_fields, lead) if buyer.dedupe_fields else ()
            reservation = leases.reserve(self.store, buyer, now, lease_ttl_ms=lease_ttl_ms,
                                         probe_ttl_ms=probe_ttl_ms, note=note, consumer=consumer)
            if reservation.status == "full":
                out.skipped.append({"buyer_id": buyer.id, "reason": f"cap_full:{reservation.cap}"})
                continue
            if reservation.status == "duplicate":
                out.skipped.append({"buyer_id": buyer.id, "reason": "duplicate"})
                continue
            if reservation.status == "not_ready":
                rebuild.request(self.store, self.settle_r, buyer, self.buyer_timeout_ms)
                out.waiting_for_rebuild = True
                continue
            if reservation.status == "circuit_open":
                out.attempts.append({"buyer_id": buyer.id, "outcome": CIRCUIT_OPEN, "ms": 0})
                out.skipped.append({"buyer_id": buyer.id, "reason": CIRCUIT_OPEN})
                metrics.attempt(buyer.id, CIRCUIT_OPEN)
                continue
            outcome, ms = self.deliverer.deliver(buyer.endpoint_url,
                                                 buyer_body(lead_id, publisher.id, buyer.price, lead_json),
                                                 idempotency_key(publisher.id, lead_id, buyer.id))
            out.attempts.append({"buyer_id": buyer.id, "outcome": outcome, "ms": ms})
            metrics.attempt(buyer.id, outcome, ms)
            if outcome == ACCEPTED:
                # Confirmed by the caller, in the same round trip that records the answer.
                out.status, out.buyer_id, out.price = "sold", buyer.id, buyer.price
                out.sold_at, out.lease = now, reservation.lease
                return out
            # The buyer said no: give the slot back and forget the attempt, in one round trip.
            # A refund that cannot reach Redis raises: the slot stays taken (safe for the cap;
            # the reconciliation gives it back) and the publisher gets a 503 to retry.
            pipe = self.store.redis.pipeline(transaction=False)
            leases.finish_in(self.store, pipe, reservation.lease, outcome,
                             breaker_failures=self.breaker_failures, breaker_cooldown_ms=self.breaker_cooldown_ms)
            pipe.delete(attempt_key)
            pipe.execute()
        return out
