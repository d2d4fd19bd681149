"""A buyer's sales as the ledger and the settlement queue know them, for cap rebuilds and
reconciliation."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

from . import settlement
from .buyers import to_minor
from .db import db
from .ledger import sold_since
from .windows import Window


@dataclass(frozen=True)
class Sale:
    at: datetime  # aware UTC: the time whose windows the sale's lease counted in
    cents: int
    lease_id: str | None
    reserved_us: int | None  # Redis time of the lease


def sales_since(settle_r, buyer_id: str, since: datetime) -> dict[tuple[str, str], Sale]:
    """Sales of `buyer_id` since `since` (aware): settled, queued, or taken by a running job,
    keyed by (publisher_id, lead_id) so a sale seen in two places counts once."""
    sales: dict[tuple[str, str], Sale] = {}
    for item in settlement.unsettled(settle_r):
        if item["status"] == "sold" and item["buyer_id"] == buyer_id:
            at = datetime.fromisoformat(item["sold_at"]).astimezone(timezone.utc)
            lease = item.get("lease") or [None, None]
            sales[(item["publisher_id"], item["lead_id"])] = Sale(
                at, to_minor(item["price"]), lease[1], item.get("reserved_us"))
    # The ledger is read after the queue: a sale moving from one to the other meanwhile is
    # still seen (in the ledger), and the key de-duplicates one seen in both.
    with db.connection_context():
        for pub, lead_id, sold_at, price, lease_id, reserved_us in sold_since(buyer_id, since):
            sales[(pub, lead_id)] = Sale(sold_at.replace(tzinfo=timezone.utc), to_minor(price),
                                         lease_id, reserved_us)
    return sales


def total(sales: Iterable[Sale], cap: str, w: Window) -> int:
    """Leads (or cents, for daily_budget) of `sales` inside window `w`."""
    inside = [s.cents for s in sales if w.start <= s.at < w.end]
    return sum(inside) if cap == "daily_budget" else len(inside)
