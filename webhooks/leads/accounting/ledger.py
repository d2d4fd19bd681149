"""The lead ledger: idempotent settlement writes and the reads built on them."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, cast

import peewee as pw

from webhooks.billing import charges
from webhooks.billing.charges import Charged
from webhooks.caps.dedupe import stored_consumer_keys
from webhooks.errors import Unavailable
from webhooks.events import outbox
from webhooks.leads.accounting import feedback, lookup, payouts
from webhooks.leads.accounting.item import SettlementItem
from webhooks.leads.accounting.reports import count_settled
from webhooks.leads.posting.delivery import UNKNOWN
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage.live import keys
from webhooks.storage.live.batch import Client
from webhooks.storage.live.redis import Store
from webhooks.storage.records import audit, fastsql
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, db, retried
from webhooks.storage.records.models import Buyer, Lead, LeadAttempt, LeadReturn, Sale, utcnow
from webhooks.storage.states import TEST_STATUSES, LeadStatus, SaleStatus

log = logging.getLogger(__name__)


def _naive_utc(iso: str | None) -> datetime | None:
    if iso is None:
        return None
    return datetime.fromisoformat(iso).replace(tzinfo=None)


def _lead_row(item: SettlementItem, now: datetime, lookup_key: bytes) -> dict[str, Any]:
    return {
        "publisher_id": item.publisher_id,
        "lead_id": item.lead_id,
        "status": item.status,
        "buyer_id": item.buyer_id,
        "price": item.price,
        "payout": item.payout,
        "payload": item.payload,
        "received_at": _naive_utc(item.received_at),
        "sold_at": _naive_utc(item.sold_at),
        "settled_at": now,
        "request_id": item.request_id,
        "lease_id": item.lease[1] if item.lease else None,
        "reserved_us": item.reserved_us,
        "skipped": json.dumps(list(item.skipped), separators=(",", ":")) if item.skipped else None,
        "charge_account": item.charge[0] if item.charge else None,
        "charge_minor": item.charge[1] if item.charge else None,
        "consent": json.dumps(list(item.consent), separators=(",", ":")) if item.consent else None,
        **lookup.digests(item.payload, lookup_key),
    }


def _sale_rows(items: Iterable[SettlementItem], holds: dict[str, int]) -> list[dict[str, Any]]:
    """The sales of settled leads, in their order (one per buyer of a shared lead; a test
    lead's is never a sale), each payout held for its publisher's `holds` days (payouts.hold_days)."""
    rows = []
    for i in items:
        for sale in i.sales():
            sold_at = _naive_utc(sale.sold_at or i.received_at)
            assert sold_at is not None  # received_at is always set
            state, payable_at = payouts.new_state(holds.get(i.publisher_id, 0), sold_at)
            rows.append(
                {
                    "publisher_id": i.publisher_id,
                    "lead_id": i.lead_id,
                    "buyer_id": sale.buyer_id,
                    "price": sale.price,
                    "payout": sale.payout,
                    "status": SaleStatus.SOLD,
                    "sold_at": sold_at,
                    "lease_id": sale.lease[1] if sale.lease else None,
                    "reserved_us": sale.reserved_us,
                    "charge_account": sale.charge[0] if sale.charge else None,
                    "charge_minor": sale.charge[1] if sale.charge else None,
                    "payout_state": state,
                    "payable_at": payable_at,
                }
            )
    return rows


def _write_extras(new: list[SettlementItem], now: datetime, holds: dict[str, int]) -> None:
    """Attempts, payout, report, event and audit rows of leads whose row was just inserted:
    a sale's `lead.sold` event is written with it (none for a test lead: never a sale). Its
    payout goes to the publisher's balance, or to its held sum under a hold (`holds`)."""
    attempts = [
        {
            "publisher_id": i.publisher_id,
            "lead_id": i.lead_id,
            "seq": seq,
            "buyer_id": a["buyer_id"],
            "outcome": a["outcome"],
            "ms": a["ms"],
            "bid": a.get("bid"),
        }
        for i in new
        for seq, a in enumerate(i.attempts, 1)
    ]
    if attempts:
        fastsql.insert_many(LeadAttempt, attempts)
    earned: dict[str, Decimal] = {}
    for i in new:
        for sale in i.sales():
            if sale.payout:
                earned[i.publisher_id] = earned.get(i.publisher_id, Decimal(0)) + Decimal(sale.payout)
    for publisher_id, amount in sorted(earned.items()):
        if amount > 0 and holds.get(publisher_id, 0) > 0:
            payouts.credit(publisher_id, held=amount)
        elif amount > 0:
            payouts.credit(publisher_id, payable=amount)
    count_settled(new)
    charges.debit_sales(
        [(Charged(*s.charge), f"{i.publisher_id}:{i.lead_id}") for i in new for s in i.sales() if s.charge], now
    )
    outbox.emit_many(
        [
            outbox.sold_event(
                i.publisher_id, i.lead_id, payout=_payout(s.payout), buyer_id=s.buyer_id, price=s.price, nth=n
            )
            for i in new
            for n, s in enumerate(i.sales())
        ],
        now,
    )
    audit.record_many(
        "settlement",
        "lead",
        [
            (
                f"lead.{i.status}",
                f"{i.publisher_id}:{i.lead_id}",
                {
                    "buyer_id": i.buyer_id,
                    "price": i.price,
                    "commission": i.payout,
                    "attempts": len(i.attempts),
                    **({"sales": [[s.buyer_id, s.price] for s in i.sales()]} if i.more_sales else {}),
                },
            )
            for i in new
        ],
    )


def _payout(payout: str | None) -> str:
    return f"{Decimal(payout or 0):.2f}"


def settle(items: Iterable[SettlementItem], *, lookup_key: bytes = lookup.DEFAULT_KEY) -> int:
    """Write settlements; return how many were new (`settle_new`)."""
    return len(settle_new(items, lookup_key=lookup_key))


def settle_new(items: Iterable[SettlementItem], *, lookup_key: bytes = lookup.DEFAULT_KEY) -> list[SettlementItem]:
    """Write settlements; return those that were new; each lead's e-mail and phone kept as
    digests under `lookup_key` (SUPPRESSION_KEY) for the lookup. Safe to repeat: the lead's unique key
    (publisher, lead_id) decides, and only a new lead row brings its sale, attempts, payout and
    audit entry (the sale's own unique key, (publisher, lead_id, buyer), refuses a second).
    A batch is written with a handful of statements in one transaction; if any
    lead of it was settled before, the batch is written again lead by lead."""
    now = utcnow()
    unique = list({(i.publisher_id, i.lead_id): i for i in items}.values())
    return retried(lambda: _settle(unique, now, lookup_key), f"settling {len(unique)} lead(s)")


def _settle(unique: list[SettlementItem], now: datetime, lookup_key: bytes) -> list[SettlementItem]:
    holds = payouts.hold_days(i.publisher_id for i in unique if i.status == LeadStatus.SOLD)
    try:
        with db.atomic():
            fastsql.insert_many(Lead, [_lead_row(i, now, lookup_key) for i in unique])
            sales = _sale_rows(unique, holds)
            if sales:
                fastsql.insert_many(Sale, sales)
            _write_extras(unique, now, holds)
        return unique
    except pw.IntegrityError:
        pass  # some were settled before (a job run again): decide one by one
    written = []
    with db.atomic():
        for item in unique:
            query = Lead.insert(**_lead_row(item, now, lookup_key)).on_conflict_ignore()
            if db.execute(query).rowcount == 1:
                written.append(item)
                for sale in _sale_rows([item], holds):
                    db.execute(Sale.insert(**sale).on_conflict_ignore())
                _write_extras([item], now, holds)
    return written


def _attempt(a: LeadAttempt) -> dict[str, Any]:
    out = {"buyer_id": a.buyer_id, "outcome": a.outcome, "ms": a.ms}
    if a.bid is not None:
        out["bid"] = f"{Decimal(a.bid):.2f}"
    return out


def sales_of(leads: Sequence[Lead], *, with_feedback: bool = True) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The sales of `leads` as their records show them, by (publisher_id, lead_id), in the order
    they were made; three queries for any number of leads (a page of the lead search), two
    without the buyers' feedback."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {(lead.publisher_id, lead.lead_id): [] for lead in leads}
    if not leads:
        return out
    rows = [
        row
        for row in Sale.select()
        .where(
            Sale.publisher_id.in_(sorted({lead.publisher_id for lead in leads})),
            Sale.lead_id.in_(sorted({lead.lead_id for lead in leads})),
        )
        .order_by(Sale.id)
        if (row.publisher_id, row.lead_id) in out
    ]
    last_return: dict[int, str] = {}
    if rows:
        for r in (
            LeadReturn.select(LeadReturn.sale_id, LeadReturn.return_id)
            .where(LeadReturn.sale_id.in_([row.id for row in rows]))
            .order_by(LeadReturn.id)
        ):
            last_return[r.sale_id] = r.return_id  # the newest return of each sale
    said = feedback.of_sales([row.id for row in rows]) if with_feedback and rows else {}
    for row in rows:
        view = sale_view(row, last_return.get(row.id))
        if with_feedback:
            view["feedback"] = said.get(row.id, [])
        out[(row.publisher_id, row.lead_id)].append(view)
    return out


def sale_view(sale: Sale, return_id: str | None) -> dict[str, Any]:
    """One sale as a lead's record lists it; `return_id` the newest return asked for it."""
    view: dict[str, Any] = {
        "buyer_id": sale.buyer_id,
        "price": f"{Decimal(sale.price):.2f}",
        "payout": None if sale.payout is None else f"{Decimal(sale.payout):.2f}",
        "status": sale.status,
        "returned_at": None if sale.returned_at is None else sale.returned_at.isoformat() + "Z",
        "return_reason": sale.return_reason,
    }
    if return_id is not None:
        view["return_id"] = return_id
    return view


def attempts_of(leads: list[Lead]) -> dict[tuple[str, str], list[LeadAttempt]]:
    """The attempts of `leads` in one query (a page of the lead search, the console's last leads),
    by (publisher_id, lead_id), in order."""
    out: dict[tuple[str, str], list[LeadAttempt]] = {(lead.publisher_id, lead.lead_id): [] for lead in leads}
    if not leads:
        return out
    # IN lists on both columns of the (publisher_id, lead_id, seq) index: a few ranges of it,
    # never a scan; a pair that is not one of the leads is dropped here
    rows = (
        LeadAttempt.select()
        .where(
            LeadAttempt.publisher_id.in_(sorted({lead.publisher_id for lead in leads})),
            LeadAttempt.lead_id.in_(sorted({lead.lead_id for lead in leads})),
        )
        .order_by(LeadAttempt.publisher_id, LeadAttempt.lead_id, LeadAttempt.seq)
    )
    for row in rows:
        wanted = out.get((row.publisher_id, row.lead_id))
        if wanted is not None:
            wanted.append(row)
    return out


def lead_view(
    lead: Lead, attempts: Sequence[LeadAttempt] | None = None, sales: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A lead as GET /v1/admin/leads/<id> shows it; `attempts` its attempts in order and `sales`
    its sales (sales_of), when the caller read them already (a page of the lead search reads a
    page's in one query each)."""
    if sales is None:
        sales = sales_of([lead])[(lead.publisher_id, lead.lead_id)]
    if attempts is None:
        attempts = list(
            LeadAttempt.select()
            .where(LeadAttempt.publisher_id == lead.publisher_id, LeadAttempt.lead_id == lead.lead_id)
            .order_by(LeadAttempt.seq)
        )
    test = lead.status in TEST_STATUSES  # recorded as test_sold / test_unsold: never a sale
    return {
        "lead_id": lead.lead_id,
        "publisher_id": lead.publisher_id,
        "status": TEST_STATUSES.get(lead.status, lead.status),
        "test": test,
        "buyer_id": lead.buyer_id,
        "price": None if lead.price is None else f"{Decimal(lead.price):.2f}",
        "commission": None if lead.payout is None else f"{Decimal(lead.payout):.2f}",
        "attempts": [_attempt(a) for a in attempts],
        # a buyer may hold this lead without it being sold (its routing died): see docs/api.md
        "review": any(a.outcome == UNKNOWN for a in attempts),
        "skipped": json.loads(lead.skipped) if lead.skipped else [],
        "consent": json.loads(lead.consent) if lead.consent else [],
        "returned_at": None if lead.returned_at is None else lead.returned_at.isoformat() + "Z",
        "return_reason": lead.return_reason,
        "sales": sales,
        "received_at": lead.received_at.isoformat() + "Z",
        "settled_at": lead.settled_at.isoformat() + "Z",
    }


def answer_for(publisher_id: str, lead_id: str) -> dict[str, Any] | None:
    """The answer the publisher was given for a settled lead (as settlement.answer_of made
    it), or None when the ledger has no such lead."""
    lead = Lead.get_or_none(Lead.publisher_id == publisher_id, Lead.lead_id == lead_id)
    if lead is None:
        return None
    record = lead_view(lead, sales=sales_of([lead], with_feedback=False)[(lead.publisher_id, lead.lead_id)])
    answer = {k: record[k] for k in ("lead_id", "status", "buyer_id", "price", "attempts")}
    if answer["status"] == "returned":  # returned since: the publisher was told it was sold
        answer["status"] = "sold"
    if answer["status"] == "sold" and not record["test"]:
        answer["sales"] = [{"buyer_id": s["buyer_id"], "price": s["price"]} for s in record["sales"]]
    if record["test"]:
        answer["test"] = True
    return answer


def ask_for_answer(publisher_id: str, lead_id: str, unreachable: str) -> dict[str, Any] | None:
    """`answer_for` on a connection of its own, for the lead path: Unavailable (503) with the
    message `unreachable` when the ledger cannot be asked."""
    try:
        with db.connection_context():
            return answer_for(publisher_id, lead_id)
    except UNAVAILABLE_ERRORS:
        raise Unavailable(unreachable) from None


def flagged(limit: int = 50) -> list[Lead]:
    """Leads flagged for review, newest first: an attempt of theirs ended `unknown` (a buyer
    may hold the lead, unsold: its routing died and the buyer did not confirm the re-offer).
    The flagged attempts are found on their outcome's index (sql/019), not by a scan."""
    pairs = LeadAttempt.select(LeadAttempt.publisher_id, LeadAttempt.lead_id).where(LeadAttempt.outcome == UNKNOWN)
    return list(
        Lead.select()
        .where(pw.Tuple(Lead.publisher_id, Lead.lead_id).in_(pairs))
        .order_by(Lead.received_at.desc())
        .limit(limit)
    )


# --- what a lead leaves behind (docs/api.md "Data kept per lead is bounded") --------------------

ERASED = ""  # a lead's body once purged or erased: its figures, attempts and trace stay
# what an emptied body leaves of it: nothing, its lookup digests neither
EMPTIED = {"payload": ERASED, "email_digest": None, "phone_digest": None}
SHORT_KEPT = (LeadStatus.UNSOLD, LeadStatus.TEST_SOLD, LeadStatus.TEST_UNSOLD)  # LEAD_BODY_RETENTION_DAYS
LONG_KEPT = (LeadStatus.SOLD, LeadStatus.RETURNED)  # SOLD_LEAD_BODY_RETENTION_DAYS


@dataclass(frozen=True, kw_only=True)
class Mark:
    """Where a purge walk got to in the ledger's (received_at, id) order: every lead before it
    has been looked at."""

    received_at: datetime
    id: int

    def dumps(self) -> str:
        return f"{self.received_at.isoformat()}|{self.id}"

    @classmethod
    def loads(cls, raw: str | None) -> Mark | None:
        if not raw:
            return None
        at, _, pk = raw.partition("|")
        return cls(received_at=datetime.fromisoformat(at), id=int(pk))


def purge_chunk(statuses: tuple[str, ...], before: datetime, after: Mark | None, size: int) -> tuple[int, Mark | None]:
    """Empty the bodies of up to `size` leads received before `before` (naive UTC) whose
    status is one of `statuses`, walking on from `after` by the index on received_at; (how many
    were emptied, where the walk got to: None once nothing is left before `before`). Safe to
    run twice or at once: emptying an empty body changes nothing."""
    query = Lead.select(Lead.id, Lead.received_at, Lead.status).where(Lead.received_at < before)
    if after is not None:
        query = query.where(
            (Lead.received_at > after.received_at) | ((Lead.received_at == after.received_at) & (Lead.id > after.id))
        )
    rows = list(
        cast("Iterable[tuple[int, datetime, str]]", query.order_by(Lead.received_at, Lead.id).limit(size).tuples())
    )
    if not rows:
        return 0, None
    ids = [pk for pk, _at, status in rows if status in statuses]
    emptied = 0
    if ids:
        emptied = Lead.update(EMPTIED).where(Lead.id.in_(ids), _not_emptied()).execute()
    last_id, last_at, _status = rows[-1]
    return emptied, Mark(received_at=last_at, id=last_id)


def erase_personal_data(lead: Lead, actor: str = "admin") -> dict[str, Any]:
    """Erase what `lead` holds of its consumer (its body; the sale, price, payout, attempts and
    trace stay) and record it in the audit log; the lead record after it. Safe to repeat."""
    with db.atomic():
        erased = Lead.update(EMPTIED).where(Lead.id == lead.id, _not_emptied()).execute()
        audit.record(
            actor,
            "lead.personal_data_erased",
            "lead",
            f"{lead.publisher_id}:{lead.lead_id}",
            {"body_bytes": len(lead.payload.encode()) if erased else 0},
        )
    return {**lead_view(lead), "personal_data": "erased"}


def _not_emptied() -> pw.Expression:
    """A lead that still has its body or a lookup digest."""
    return (Lead.payload != ERASED) | Lead.email_digest.is_null(False) | Lead.phone_digest.is_null(False)


@dataclass(frozen=True, kw_only=True)
class Kept:
    """How long one group of leads keeps its bodies, and where its purge walk's mark lives."""

    name: str  # "unsold" (unsold and test leads) or "sold" (sold and returned)
    statuses: tuple[str, ...]
    days: int


def kept(lead_days: int, sold_days: int) -> tuple[Kept, Kept]:
    """The two retention groups under LEAD_BODY_RETENTION_DAYS and SOLD_LEAD_BODY_RETENTION_DAYS."""
    return (
        Kept(name="unsold", statuses=SHORT_KEPT, days=lead_days),
        Kept(name="sold", statuses=LONG_KEPT, days=sold_days),
    )


def purge_bodies(
    marks: Client,
    groups: tuple[Kept, ...],
    now: datetime,
    *,
    chunk: int = 500,
    time_budget_s: float = 20.0,
    progress: Callable[[str, int, Mark], None] | None = None,
) -> dict[str, int]:
    """Empty the bodies of leads kept past their group's days, `chunk` leads a statement, for
    `time_budget_s` at most; how many were emptied per group. Each group walks the ledger in
    received_at order from the mark it left in Redis (`marks`, keys.retention_mark), so a run
    reads only the leads received since the last one; the mark is saved after each chunk, and
    a lost one only makes the next walks start over from the oldest lead. What is left when
    the budget runs out (or a dependency fails: the exception goes to the caller) is for the
    next run."""
    until = time.monotonic() + time_budget_s
    emptied = {g.name: 0 for g in groups}
    for g in groups:
        before = now.replace(tzinfo=None) - timedelta(days=g.days)
        key = keys.retention_mark(g.name)
        mark = Mark.loads(cast("str | None", marks.get(key)))
        while time.monotonic() < until:
            n, mark = purge_chunk(g.statuses, before, mark, chunk)
            if mark is None:
                break
            marks.set(key, mark.dumps())
            emptied[g.name] += n
            if progress is not None:
                progress(g.name, n, mark)
    return emptied


def forget_consumer(store: Store, lead: Lead) -> int:
    """Delete the dedupe keys the sale of `lead` set at its buyer (digests of the consumer's
    e-mail or phone), while they still name that sale: its lease, or "ledger" when rebuilt
    from it. Read `lead` before its body is erased; how many keys went."""
    if lead.buyer_id is None or lead.status not in LONG_KEPT:
        return 0
    row = Buyer.get_or_none(Buyer.id == lead.buyer_id)
    try:
        fields = json.loads(lead.payload)
    except ValueError:
        return 0
    if row is None or not isinstance(fields, dict):
        return 0
    rule = BuyerRule.from_row(row)
    gone = 0
    for key in stored_consumer_keys(rule.id, rule.dedupe_fields, fields):
        gone += store.release_claim(key, lead.lease_id or "ledger") or store.release_claim(key, "ledger")
    return gone
