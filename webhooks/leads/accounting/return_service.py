"""A return as the admin API, the console and the CLI make it: the reason checked, the sale
returned once under its buyer's policy (returns.request_return: refund, payout reversed,
counted once) or left for review, and the outbox woken for its event; a review's decision."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from rq import Queue

from webhooks.errors import BadRequest, Conflict, NotFound, ValidationError
from webhooks.formats.validate import is_id
from webhooks.leads.accounting import returns
from webhooks.storage.live import outbox_queue
from webhooks.storage.live.redis import Store


def return_now(
    store: Store,
    *,
    queue_redis: Store,
    queue: Queue,
    lead_id: str,
    publisher_id: str | None,
    reason: object,
    buyer_id: object = None,
    actor: str = "admin",
) -> returns.Returned:
    """Return a sale of a lead and wake the outbox (on `queue_redis`, for `queue`'s worker): done,
    or pending review. 400 invalid_return for a reason that is not a short string or a
    buyer_id that is not an id. `actor` is who the audit row names (the admin API and console,
    or the CLI)."""
    if reason is not None and (not isinstance(reason, str) or len(reason) > returns.MAX_REASON):
        raise ValidationError(
            "invalid_return", "reason", f"must be a string of at most {returns.MAX_REASON} characters"
        )
    if buyer_id is not None and not is_id(buyer_id):
        raise ValidationError("invalid_return", "buyer_id", "must be a buyer id")
    done = returns.request_return(
        store, lead_id, publisher_id, reason, buyer_id=cast("str | None", buyer_id), actor=actor
    )
    outbox_queue.wake(queue_redis.redis, queue)  # its lead.returned or return.requested event
    return done


MAX_MANY = 100  # leads one bulk return takes


class Outcome(enum.StrEnum):
    """What a bulk return did with one lead."""

    RETURNED = "returned"
    PENDING = "return_pending"  # its buyer reviews returns: it awaits review
    REFUSED = "refused"


@dataclass(frozen=True, kw_only=True)
class OneReturn:
    """One lead of a bulk return: what happened and, when refused, why (the error the single
    return would have answered)."""

    publisher_id: str
    lead_id: str
    outcome: Outcome
    why: str | None = None


def return_many(
    store: Store,
    *,
    queue_redis: Store,
    queue: Queue,
    leads: Sequence[tuple[str, str]],
    reason: object,
    buyer_id: object = None,
) -> list[OneReturn]:
    """Return each of `leads` ((publisher_id, lead_id), at most MAX_MANY) as `return_now`
    returns one, each on its own under its buyer's policy: one refused leaves the others be.
    400 invalid_return for more leads than MAX_MANY, or none."""
    if not leads or len(leads) > MAX_MANY:
        raise ValidationError("invalid_return", "leads", f"must name from 1 to {MAX_MANY} leads")
    out = []
    for publisher_id, lead_id in leads:
        try:
            made = return_now(
                store,
                queue_redis=queue_redis,
                queue=queue,
                lead_id=lead_id,
                publisher_id=publisher_id,
                reason=reason,
                buyer_id=buyer_id,
            )
        except (BadRequest, Conflict, NotFound) as exc:
            out.append(OneReturn(publisher_id=publisher_id, lead_id=lead_id, outcome=Outcome.REFUSED, why=exc.message))
            continue
        outcome = Outcome.PENDING if made.pending else Outcome.RETURNED
        out.append(OneReturn(publisher_id=publisher_id, lead_id=lead_id, outcome=outcome))
    return out


def decide_now(
    store: Store, *, queue_redis: Store, queue: Queue, return_id: str, approve: bool, actor: str = "admin"
) -> dict[str, Any]:
    """Approve or reject a pending return and wake the outbox for its event; the return."""
    decided = returns.decide(store, return_id, approve=approve, actor=actor)
    outbox_queue.wake(queue_redis.redis, queue)
    return decided
