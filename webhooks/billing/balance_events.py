"""A billed buyer's balance events (docs/api.md "Buyer balances"): `buyer.balance_low` when what
it can spend is below its `low_balance`, `buyer.balance_depleted` when a lead skipped it for its
balance (reason `balance` in the routing trace); each once per cycle of its balance, which
starts again at each top-up (lua/sync_balance.lua).

The lead path never writes to the database, so the settlement worker writes them once a
batch's balances are synced (workers/settle.py): for the buyers of the batch's billed sales,
from what Redis holds after their sync; for the buyers its leads skipped for their balance,
from what Redis holds now. An event's subject is its buyer, cycle and wallet: the events
table's unique (type, subject) key keeps a drain run again, or two workers, to one event each.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Set
from datetime import datetime

import peewee as pw

from webhooks.billing import balance
from webhooks.billing.balance import Billing
from webhooks.errors import InvalidPayload
from webhooks.events import outbox
from webhooks.events.outbox import EventType, NewEvent
from webhooks.storage.live.redis import Store
from webhooks.storage.live.scripts import Balance
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, db, retried
from webhooks.storage.records.models import Buyer

log = logging.getLogger(__name__)

BUYERS_PER_QUERY = 500  # ids per IN list (SQLite's bound on a query's parameters)


def write(store: Store, depleted: Set[str], synced: Mapping[str, Balance], now: datetime) -> int:
    """The balance events of a settled batch (`synced`: what Redis holds of its billed buyers'
    balances after their sync, balance.sync_settled; `depleted`: the buyers its leads skipped
    for their balance), in a transaction of their own; return how many were new (for the
    caller to wake the events drain)."""
    billings = _billings(set(synced) | depleted)
    if not billings:
        return 0
    known = {b: held for b, held in synced.items() if b in billings}
    unknown = sorted(b for b in depleted if b in billings and b not in known)
    known.update(balance.held_now(store, [(b, billings[b]) for b in unknown]))
    new: list[NewEvent] = []
    for buyer_id, held in sorted(known.items()):
        billing = billings[buyer_id]
        available = billing.available_minor(held)
        if billing.low_balance_minor is not None and available < billing.low_balance_minor:
            new.append(_event(EventType.BUYER_BALANCE_LOW, buyer_id, billing, held, available))
        if buyer_id in depleted:
            new.append(_event(EventType.BUYER_BALANCE_DEPLETED, buyer_id, billing, held, available))
    return _emit(new, now)


def _event(kind: EventType, buyer_id: str, billing: Billing, held: Balance, available: int) -> NewEvent:
    return outbox.buyer_event(
        kind, buyer_id=buyer_id, wallet=billing.key, cycle=held.cycle, available=billing.text(available)
    )


def _emit(new: list[NewEvent], now: datetime) -> int:
    """Insert the events the outbox lacks. A database outage fails the drain (RQ runs it again,
    and the batch's events with it); a refusal is logged, so that it cannot stop settlement."""
    if not new:
        return 0

    def transaction() -> int:
        with db.atomic():
            return outbox.emit_once(new, now)

    try:  # drains of one batch at once may deadlock on the unique key's gaps: run again whole
        return retried(transaction, f"{len(new)} balance event(s)")
    except UNAVAILABLE_ERRORS:
        raise
    except pw.DatabaseError as exc:
        log.error("balance events refused by the database (%s): %s", exc, [(e.type, e.subject) for e in new])
        return 0


def _billings(buyer_ids: set[str]) -> dict[str, Billing]:
    """The billing of those buyers that are billed (and not deleted), read in one query per
    BUYERS_PER_QUERY ids."""
    ids, out = sorted(buyer_ids), {}
    for i in range(0, len(ids), BUYERS_PER_QUERY):
        rows = Buyer.select(Buyer.id, Buyer.billing).where(
            Buyer.id.in_(ids[i : i + BUYERS_PER_QUERY]), Buyer.billing.is_null(False), Buyer.deleted_at.is_null()
        )
        for row in rows:
            try:
                billing = Billing.from_json(row.billing)
            except (ValueError, KeyError, TypeError, InvalidPayload) as exc:
                log.error("buyer %s: billing unreadable, no balance events (%s)", row.id, exc)
                continue
            if billing is not None:
                out[row.id] = billing
    return out
