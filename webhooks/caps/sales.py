"""A buyer's sales as the ledger and the settlement queue know them, for cap rebuilds and
reconciliation; a wallet's billed sales still queued, for its balance's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, cast

from peewee import fn

from webhooks.billing import balance
from webhooks.billing.balance import Billing
from webhooks.caps.windows import Window
from webhooks.formats.validate import cents
from webhooks.storage.live import settle_queue
from webhooks.storage.live.batch import Client
from webhooks.storage.live.scripts import LedgerBalance
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead
from webhooks.storage.records.models import Sale as SaleRow
from webhooks.storage.states import SaleStatus


@dataclass(frozen=True)
class Sale:
    at: datetime  # aware UTC: the time whose windows the sale's lease counted in
    cents: int
    lease_id: str | None
    reserved_us: int | None  # Redis time of the lease


# What sold_since reads of a sale, in its tuples' order (sold_at naive UTC).
SALE_COLUMNS = (
    SaleRow.publisher_id,
    SaleRow.lead_id,
    SaleRow.sold_at,
    SaleRow.price,
    SaleRow.lease_id,
    SaleRow.reserved_us,
)
KEPT = SaleRow.status != SaleStatus.RETURNED  # a sale counted in caps (a return gives its slot back)


def sold_since(buyer_id: str, since: datetime) -> list[tuple[Any, ...]]:
    """(publisher_id, lead_id, sold_at naive UTC, price, lease_id, reserved_us) of the buyer's
    sales since `since` not returned (a shared lead's sale to it among them)."""
    rows = (
        SaleRow.select(*SALE_COLUMNS)
        .where(SaleRow.buyer_id == buyer_id, KEPT, SaleRow.sold_at >= since.replace(tzinfo=None))
        .tuples()
    )
    return list(cast("Iterable[tuple[Any, ...]]", rows))  # peewee's stubs: .tuples() yields models


def sales_since(
    queue_redis: Client, buyer_id: str, since: datetime, pending: list[dict[str, Any]] | None = None
) -> dict[tuple[str, str], Sale]:
    """Sales of `buyer_id` since `since` (aware): settled, queued, or taken by a running job,
    keyed by (publisher_id, lead_id) so a sale seen in two places counts once. `pending` is
    the queue as `settle_queue.unsettled` read it, when the caller already has it."""
    sales = queued_sales(queue_redis, buyer_id, since, pending)
    # The ledger is read after the queue: a sale moving from one to the other meanwhile is
    # still seen (in the ledger), and the key de-duplicates one seen in both.
    with db.connection_context():
        for pub, lead_id, sold_at, price, lease_id, reserved_us in sold_since(buyer_id, since):
            sales[(pub, lead_id)] = Sale(sold_at.replace(tzinfo=timezone.utc), cents(price), lease_id, reserved_us)
    return sales


def queued_sales(
    queue_redis: Client, buyer_id: str, since: datetime, pending: list[dict[str, Any]] | None = None
) -> dict[tuple[str, str], Sale]:
    """The buyer's sales since `since` still in the settlement queue (or taken by a running
    job), keyed by (publisher_id, lead_id): a sale queued twice (a journal pushed again)
    counts once."""
    sales: dict[tuple[str, str], Sale] = {}
    for item in settle_queue.unsettled(queue_redis, mentioning=buyer_id) if pending is None else pending:
        for sale in settle_queue.sales_in(item):
            if sale["buyer_id"] != buyer_id:
                continue
            at = datetime.fromisoformat(sale["sold_at"]).astimezone(timezone.utc)
            if at >= since:
                lease = sale.get("lease") or [None, None]
                sales[(item["publisher_id"], item["lead_id"])] = Sale(
                    at, cents(sale["price"]), lease[1], sale.get("reserved_us")
                )
    return sales


def settled_of(
    wanted: Iterable[tuple[str, str]], buyer_id: str | None = None, chunk: int = 500
) -> set[tuple[str, str]]:
    """Which of the (publisher_id, lead_id) pairs the ledger holds: as any status, or with
    `buyer_id` with a sale to that buyer (returned since or not). One query per publisher and
    `chunk` leads, reading two short columns."""
    by_publisher: dict[str, list[str]] = {}
    for pub, lead_id in wanted:
        by_publisher.setdefault(pub, []).append(lead_id)
    found: set[tuple[str, str]] = set()
    for pub, ids in by_publisher.items():
        for i in range(0, len(ids), chunk):
            some = ids[i : i + chunk]
            query = (
                Lead.select(Lead.publisher_id, Lead.lead_id).where(Lead.publisher_id == pub, Lead.lead_id.in_(some))
                if buyer_id is None
                else SaleRow.select(SaleRow.publisher_id, SaleRow.lead_id).where(
                    SaleRow.publisher_id == pub, SaleRow.lead_id.in_(some), SaleRow.buyer_id == buyer_id
                )
            )
            found.update(cast("Iterable[tuple[str, str]]", query.tuples()))
    return found


def ledger_total(buyer_id: str, cap: str, w: Window) -> int:
    """Leads (or cents, for daily_budget) the ledger has sold to `buyer_id` inside window
    `w`, counted by the database (one row back, however many sales)."""
    count, amount = cast(
        "tuple[int, Any]",
        SaleRow.select(fn.COUNT(SaleRow.id), fn.COALESCE(fn.SUM(fn.ROUND(SaleRow.price * 100)), 0))
        .where(
            SaleRow.buyer_id == buyer_id,
            KEPT,
            SaleRow.sold_at >= w.start.replace(tzinfo=None),
            SaleRow.sold_at < w.end.replace(tzinfo=None),
        )
        .tuples()
        .get(),
    )
    return int(round(float(amount))) if cap == "daily_budget" else int(count)  # whole cents, summed


def total(sales: Iterable[Sale], cap: str, w: Window) -> int:
    """Leads (or cents, for daily_budget) of `sales` inside window `w`."""
    inside = [s.cents for s in sales if w.start <= s.at < w.end]
    return sum(inside) if cap == "daily_budget" else len(inside)


def with_queued_sales(
    billing: Billing, pending: Sequence[Mapping[str, Any]]
) -> tuple[LedgerBalance, list[tuple[str, str | None, int]]]:
    """The wallet as the ledger has it, with `unsettled_minor` the prices of the sales charged
    to it still queued (`pending`, settle_queue.unsettled), by any buyer, that the ledger does
    not have yet, and those sales as (buyer id, lease id, price). The queue was read first and
    the ledger after it: a sale settled in between is held and debited both at worst (the safe
    way), never neither."""
    queued: dict[str, dict[tuple[str, str], tuple[str | None, int]]] = {}  # by buyer
    for item in pending:
        for sold in settle_queue.sales_in(item):
            charge, lease = sold.get("charge"), sold.get("lease")
            if charge and charge[0] == billing.key:
                sale = (str(lease[1]) if lease else None, int(charge[1]))
                queued.setdefault(str(sold["buyer_id"]), {})[(item["publisher_id"], item["lead_id"])] = sale
    with db.connection_context():
        charges = []
        for buyer_id, sales in queued.items():
            settled = settled_of(list(sales), buyer_id)
            charges += [(buyer_id, lease_id, minor) for key, (lease_id, minor) in sales.items() if key not in settled]
        return balance.ledger_wallet(billing, unsettled_minor=sum(minor for _, _, minor in charges)), charges
