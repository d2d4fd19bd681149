"""A return as the admin API, the console and the CLI make it: the reason checked, the sale
returned once under its buyer's policy (returns.request_return: refund, payout reversed,
counted once) or left for review, and the outbox woken for its event; a review's decision."""

from __future__ import annotations

from typing import Any, cast

from rq import Queue

from webhooks.errors import ValidationError
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


def decide_now(
    store: Store, *, queue_redis: Store, queue: Queue, return_id: str, approve: bool, actor: str = "admin"
) -> dict[str, Any]:
    """Approve or reject a pending return and wake the outbox for its event; the return."""
    decided = returns.decide(store, return_id, approve=approve, actor=actor)
    outbox_queue.wake(queue_redis.redis, queue)
    return decided
