"""One lead as it goes through the lead path: made once by Intake.take (or by the abandoned-lead
sweep for a lead it takes over) and handed down to routing, recovery and settlement, instead
of each taking a dozen parameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from webhooks.leads.rules.earnings import Tally
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.live.scripts import CapCounter, LeadKey


@dataclass(frozen=True, kw_only=True)
class LeadContext:
    publisher: PublisherRule
    lead_id: str
    lead: dict[str, Any]  # the posted fields, lead_id left out
    payload: str  # the lead's body as posted (its settlement keeps it)
    now: datetime  # the time whose cap windows the lead counts in
    request_id: str | None
    token: str  # this request's claim token (claims.ROUTING...)
    claim_ttl_ms: int
    lease_ttl_ms: int  # a lease outlives the claim by LEAD_RECOVERY_WINDOW_MS: a retry finds it
    deadline: float  # time.monotonic() until which the claim surely is ours
    test: bool = False  # a test lead: every write of its routing replaced by a read
    caps: tuple[CapCounter, ...] = ()  # the publisher's cap counters this claim counts the lead in
    # each candidate buyer's dedupe keys of this lead (routing.Router.select, once per lead)
    consumers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # an `epl` publisher's buyers' earnings, read in the claim's round trip (intake.Intake._claim)
    earned: Mapping[str, Tally] | None = None

    @property
    def key(self) -> LeadKey:
        return LeadKey(self.publisher.id, self.lead_id)

    @property
    def attempt_key(self) -> str:
        """Its attempt note: the buyer (and lease) it is being offered to right now."""
        return self.key.attempt

    @property
    def ref(self) -> dict[str, Any]:
        """The lead itself, as its attempt notes carry it: enough to offer it again and settle
        it (the abandoned-lead sweep, leads/path/recovery.py)."""
        return lead_ref(self.publisher.id, self.lead_id, self.payload, self.request_id)


def lead_ref(publisher_id: str, lead_id: str, payload: str, request_id: str | None) -> dict[str, Any]:
    """The lead itself, as its attempt notes carry it: enough to offer it again and settle it."""
    return {"publisher_id": publisher_id, "lead_id": lead_id, "payload": payload, "request_id": request_id}
