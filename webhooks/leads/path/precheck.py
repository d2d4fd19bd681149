"""Pre-ping (POST /v1/leads/check; docs/leads.md "Pre-ping"): would a lead be taken now, and
has this publisher sent its lead_id before? The lead goes through what a posted lead goes
through up to its claim (the publisher's key, token bucket, field spec, filters and suppression
lists), takes one pre-ping of the publisher's quota, and then only reads: nothing is claimed,
reserved or stored, and no buyer is called. The answer says nothing about other publishers'
leads, nor why a lead would not be taken (docs/leads.md "What a pre-ping may tell").

Its Redis round trips are those of a test lead's at most: the suppression lists (when any
applies), the quota with the lead's claim, the publisher's memory mark and caps, and the
buyers' room."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhooks import metrics
from webhooks.caps import leases
from webhooks.formats.validate import cents
from webhooks.leads.path import answers
from webhooks.leads.path.routing import Route, Router
from webhooks.leads.rules import consent, precheck_quota
from webhooks.leads.rules.catalog import Snapshot
from webhooks.leads.rules.publishers import PublisherRule, cap_counters
from webhooks.storage.live import claims, keys
from webhooks.storage.states import ReservationStatus


@dataclass(frozen=True, kw_only=True)
class Eligibility:
    """The pre-ping's answer: `eligible` when a post now would be offered to a buyer (not a
    replay, not over the publisher's cap, not on its suppression lists, some buyer with room
    for it), `duplicate` when this publisher sent its lead_id before."""

    eligible: bool
    duplicate: bool

    def view(self) -> dict[str, Any]:
        return {"eligible": self.eligible, "duplicate": self.duplicate}


def check(
    router: Router,
    snapshot: Snapshot,
    publisher: PublisherRule,
    lead_id: str,
    lead: dict[str, Any],
    *,
    now: datetime,
    replay_ttl_s: int,
) -> Eligibility:
    """The lead (parsed and checked against the publisher's spec) as a post would find it now;
    429 precheck_quota when the publisher's pre-ping quota is used up. A suppressed lead takes
    from the quota and answers as one no buyer has room for."""
    route = router.select(snapshot, publisher, lead, now, test=True)
    seen, capped, refused_consent = _lead_state(router, publisher, lead_id, now, replay_ttl_s)
    metrics.prechecked(publisher.id, "answered")
    if route.suppressed:  # a post would be refused
        return Eligibility(eligible=False, duplicate=seen)
    room = _room(router, route, publisher, now)
    claims_made = router.claims_consent and not refused_consent
    offered = [
        b
        for b in route.buyers
        if room[b.id] is None and consent.possible(b.require_consent, publisher.consent, lead, claims_made)
    ]
    # A buyer that bought this consumer before (dedupe) has no room for it, as a full cap
    # leaves none: which publisher sold it is no business of this one's.
    return Eligibility(eligible=bool(offered) and not seen and not capped, duplicate=seen)


def _lead_state(
    router: Router, publisher: PublisherRule, lead_id: str, now: datetime, replay_ttl_s: int
) -> tuple[bool, bool, bool]:
    """(the lead_id was sent before, a cap of the publisher is full, a TrustedForm claim of it
    was refused) in one round trip with the taking of a pre-ping from the publisher's quota
    (429 precheck_quota when it is used up: nothing else read is told); the ledger is asked when
    Redis lost the publisher's replay memory lately, as a post would (Intake._settled_answer)."""
    counters = cap_counters(publisher, now)
    with router.store.batch() as b:
        quota = precheck_quota.take(b, publisher.id, publisher.precheck, now)
        held = b.get(keys.lead_claim(publisher.id, lead_id))
        mark = b.get(keys.lead_memory(publisher.id))
        used = [b.get(c.key) for c in counters]
        remembered = b.get(keys.consent_claim(publisher.id, lead_id))
    if not quota.value.taken:
        precheck_quota.refuse(publisher.id, quota.value, now)
    capped = any(int(u.value or 0) >= c.limit for u, c in zip(used, counters))
    refused = remembered.value is not None and json.loads(remembered.value).get("outcome") == consent.REFUSED
    if held.value is not None:
        return True, capped, refused
    now_ms = int(now.timestamp() * 1000)
    if mark.value is None or claims.memory_gap(mark.value, now_ms, replay_ttl_s):
        return _in_ledger(publisher.id, lead_id), capped, refused
    return False, capped, refused


def _in_ledger(publisher_id: str, lead_id: str) -> bool:
    from webhooks.leads.accounting.ledger import ask_for_answer

    return ask_for_answer(publisher_id, lead_id, answers.LEDGER_UNREACHABLE_AFTER_LOSS) is not None


def _room(router: Router, route: Route, publisher: PublisherRule, now: datetime) -> dict[str, str | None]:
    """Each buyer's room for the lead, read as strictly as a reservation would test it (caps,
    dedupe, circuits, trusted counters, balance); a ping/post buyer at its least bid."""
    holds = {}
    for b in route.buyers:
        hold = b.hold(b.ping.min_bid if b.ping is not None else b.price)
        if hold is not None:
            holds[b.id] = hold
    room = leases.room(
        router.store,
        route.buyers,
        now,
        budget_minor={b.id: max(1, cents(b.ping.min_bid)) for b in route.buyers if b.ping},
        consumers=route.consumers,
        publisher_id=publisher.id,
        holds=holds,
    )
    for b in route.buyers:
        if b.id not in holds:  # a price its currency cannot count: never reserved
            room[b.id] = ReservationStatus.BALANCE
    return room
