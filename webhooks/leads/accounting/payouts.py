"""Publisher payout holds (docs/leads.md "Payout holds"): a sale's payout is `held` for its
publisher's `payout_hold_days`, then `payable`; a return while it is held cancels it, a return
after it is payable is an adjustment. The state is recorded on the sale (`payout_state`) and
moved only under the sale's row lock, together with the publisher's two sums in the same
transaction (`payout_held`: its payouts held now; `balance`: what is payable, less the
adjustments), so at every committed moment those sums are what the sales add up to, and a
return racing the hold's end has exactly one effect: whichever of the two locks the sale first
decides, the other sees what it did.

The move from held to payable is made by a periodic job (`release`, workers/payouts.py) a batch
at a time, and by a return that finds a payout whose hold is over but that the job has not
reached yet (it releases it first, then adjusts it)."""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import cast

from webhooks.storage.records.db import db, is_mysql, retried
from webhooks.storage.records.models import Publisher, Sale
from webhooks.storage.states import PayoutState, SaleStatus

log = logging.getLogger(__name__)

BATCH = 500  # sales a transaction releases: a short lock on a few hundred rows at a time


def hold_days(publisher_ids: Iterable[str]) -> dict[str, int]:
    """Each publisher's payout_hold_days now (one query): what the sales settled now are held
    for. A publisher the ledger does not know holds nothing."""
    wanted = sorted(set(publisher_ids))
    if not wanted:
        return {}
    rows = Publisher.select(Publisher.id, Publisher.payout_hold_days).where(Publisher.id.in_(wanted)).tuples()
    return {pid: int(days or 0) for pid, days in cast("Iterable[tuple[str, int]]", rows)}


def new_state(days: int, sold_at: datetime) -> tuple[PayoutState, datetime]:
    """A new sale's payout state and the end of its hold: payable at once with no hold."""
    return (PayoutState.HELD if days > 0 else PayoutState.PAYABLE), sold_at + timedelta(days=days)


def credit(publisher_id: str, *, payable: Decimal = Decimal(0), held: Decimal = Decimal(0)) -> None:
    """Move the publisher's sums by these amounts (either may be negative), in the caller's
    transaction; one statement, none when both are zero."""
    if not payable and not held:
        return
    Publisher.update(balance=Publisher.balance + payable, payout_held=Publisher.payout_held + held).where(
        Publisher.id == publisher_id
    ).execute()


def on_return(sale: Sale, now: datetime) -> PayoutState:
    """The payout's side of a return, in the return's transaction, on `sale` as read under its
    row lock (a concurrent release waits for it, or went first and is seen): a held payout is
    cancelled (held sum down, never payable); one whose hold is over is released and adjusted
    (the job had not reached it); a payable one is adjusted (the balance down). The state the
    sale keeps: `cancelled` or `payable` (the return, with its `returned_at`, is the adjustment)."""
    amount = Decimal(sale.payout or 0)
    state = PayoutState(sale.payout_state)
    if state == PayoutState.HELD and (sale.payable_at is None or sale.payable_at > now):
        credit(sale.publisher_id, held=-amount)
        return PayoutState.CANCELLED
    if state == PayoutState.HELD:  # its hold is over: payable (balance +), then taken back (-)
        credit(sale.publisher_id, held=-amount)
    else:
        credit(sale.publisher_id, payable=-amount)
    return PayoutState.PAYABLE


def release(now: datetime, *, batch: int = BATCH, time_budget_s: float = 20.0) -> int:
    """Make payable every held payout whose hold ended by `now` (naive UTC), `batch` sales a
    transaction, for `time_budget_s` at most; how many were released. What is left is for the
    next run; a database error goes to the caller with the batches before it committed."""
    until = time.monotonic() + time_budget_s
    released = 0
    while time.monotonic() < until:
        query = (
            Sale.select(Sale.id)
            .where(Sale.payout_state == PayoutState.HELD, Sale.payable_at <= now)
            .order_by(Sale.payable_at, Sale.id)
            .limit(batch)
            .tuples()
        )
        due = [int(pk) for (pk,) in cast("Iterable[tuple[int]]", query)]
        if not due:
            break
        released += retried(functools.partial(_release, due), f"releasing {len(due)} payout(s)")
        if len(due) < batch:
            break
    return released


def _release(ids: list[int]) -> int:
    """Release the sales `ids` that are still held and not returned: their rows locked by
    primary key (no gap locks), in id order as every release takes them, then the publishers'
    sums in id order."""
    with db.atomic():
        query = Sale.select(Sale.id, Sale.publisher_id, Sale.payout).where(
            Sale.id.in_(ids), Sale.payout_state == PayoutState.HELD, Sale.status != SaleStatus.RETURNED
        )
        rows = list(query.order_by(Sale.id).for_update() if is_mysql() else query.order_by(Sale.id))
        if not rows:
            return 0
        Sale.update(payout_state=PayoutState.PAYABLE).where(Sale.id.in_([r.id for r in rows])).execute()
        amounts: dict[str, Decimal] = defaultdict(Decimal)
        for r in rows:
            amounts[r.publisher_id] += Decimal(r.payout or 0)
        for publisher_id in sorted(amounts):
            credit(publisher_id, payable=amounts[publisher_id], held=-amounts[publisher_id])
    log.info("%d payout(s) released from their hold", len(rows))
    return len(rows)
