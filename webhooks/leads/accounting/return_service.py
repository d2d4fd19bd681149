"""A return as the admin API and the console make it: the reason checked, the lead returned
once (returns.return_lead: refund, payout reversed, counted once) and the outbox woken for its
lead.returned event."""

from __future__ import annotations

from typing import Any

from rq import Queue

from webhooks.errors import ValidationError
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
    actor: str = "admin",
) -> dict[str, Any]:
    """Return a sold lead and wake the outbox (on `queue_redis`, for `queue`'s worker); the
    lead's record. 400 invalid_return for a reason that is not a short string. `actor` is who
    the audit row names (the admin API and console, or the CLI)."""
    if reason is not None and (not isinstance(reason, str) or len(reason) > returns.MAX_REASON):
        raise ValidationError(
            "invalid_return", "reason", f"must be a string of at most {returns.MAX_REASON} characters"
        )
    record = returns.return_lead(store, lead_id, publisher_id, reason, actor=actor)
    outbox_queue.wake(queue_redis.redis, queue)  # its lead.returned event
    return record
