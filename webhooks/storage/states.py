"""The states Floodgate's Lua scripts, answers and ledger speak, as enums (rq's `JobStatus`).

Each is a `StrEnum`: a member is the very string Redis, JSON and the database have always
seen ("ok", "sold", "accepted"...), so it compares equal to that string and is written as it.
They live at the bottom of the layers because the scripts (storage) already speak them.
"""

from __future__ import annotations

from enum import StrEnum


class ReservationStatus(StrEnum):
    """lua/reserve_lease.lua's answer."""

    OK = "ok"
    FULL = "full"  # a cap has no room
    DUPLICATE = "duplicate"  # the buyer bought this consumer already
    BALANCE = "balance"  # a billed buyer cannot afford the lead
    CIRCUIT_OPEN = "circuit_open"  # the buyer's breaker is open (or its probe is out)
    NOT_READY = "not_ready"  # the buyer's counters are not trusted (Redis lost data)


class Circuit(StrEnum):
    """Which of a buyer's circuits is open (lua/reserve_lease.lua): its own, for every
    publisher, or the one for the lead's publisher."""

    BUYER = "buyer"
    PUBLISHER = "publisher"


class LeaseState(StrEnum):
    """A lease as lua/extend_lease.lua finds it."""

    HELD = "held"
    CONFIRMED = "confirmed"
    GONE = "gone"  # refunded, or expired


class SnapshotStatus(StrEnum):
    """lua/snapshot_caps.lua's answer."""

    OK = "ok"
    CHANGED = "changed"  # a lease came or went since the caller listed them
    NOT_READY = "not_ready"


class ClaimOutcome(StrEnum):
    """What lua/claim_lead.lua did with a lead's claim."""

    CLAIMED = "claimed"  # this request holds it now
    HELD = "held"  # another request holds it, or it holds the lead's answer
    WAIT = "wait"  # Redis lost its claims lately: no claim until the requests before may have ended
    CAPPED = "capped"  # a cap of the publisher is full: not claimed, not counted
    THROTTLED = "throttled"  # the publisher's token bucket is empty: nothing read or written


class AttemptOutcome(StrEnum):
    """How one offer of a lead to a buyer ended (docs/api.md "attempts"), plus the two internal
    outcomes that are never an attempt: WITHDRAWN (a reservation given back unoffered) and
    NOT_SENT (the post could not be built: the buyer is skipped)."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    TIMEOUT = "timeout"
    ERROR = "error"
    CIRCUIT_OPEN = "circuit_open"
    # An attempt whose answer was lost with a dead process and that the buyer did not confirm
    # when offered the lead again: the lead is unsold and flagged for review.
    UNKNOWN = "unknown"
    WITHDRAWN = "withdrawn"
    NOT_SENT = "request_not_built"


class LeadStatus(StrEnum):
    """A lead's status in its answer and in the ledger."""

    SOLD = "sold"
    UNSOLD = "unsold"
    RETURNED = "returned"  # the ledger's only: a buyer sent it back
    # the ledger's only: a test lead, and what it would have become (never counted as a sale)
    TEST_SOLD = "test_sold"
    TEST_UNSOLD = "test_unsold"


class SaleStatus(StrEnum):
    """A sale's status (sql/022): sold, returned, or a return of it awaiting review."""

    SOLD = "sold"
    RETURN_PENDING = "return_pending"
    RETURNED = "returned"


class FeedbackEvent(StrEnum):
    """What a buyer's feedback says of a sale (sql/026)."""

    CONTACTED = "contacted"
    QUALIFIED = "qualified"
    CONVERTED = "converted"  # counted in the report's conversions, once per sale
    BAD = "bad"


class PayoutState(StrEnum):
    """Where a sale's payout to its publisher stands (sql/024): held until its hold ends, then
    payable (in the publisher's balance); cancelled when the sale was returned while held."""

    HELD = "held"
    PAYABLE = "payable"
    CANCELLED = "cancelled"


class ReturnStatus(StrEnum):
    """A return's status: pending review, approved (its effects done), rejected."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


# A test lead's ledger status -> the status it would have had (its answer and record show that)
TEST_STATUSES: dict[str, str] = {LeadStatus.TEST_SOLD: LeadStatus.SOLD, LeadStatus.TEST_UNSOLD: LeadStatus.UNSOLD}


class GateVerdict(StrEnum):
    """lua/payment_gate.lua's answer for a payment (or refund) webhook."""

    CLAIMED = "claimed"
    DUPLICATE = "duplicate"
    IN_FLIGHT = "in_flight"
