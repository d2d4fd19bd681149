"""Lead returns (docs/api.md "Lead returns", "Sales"): a buyer sends back one sale of a lead,
under its return policy (window, reason codes, a limit over a rolling period, automatic or
manual review). Every return is a `lead_returns` row naming its sale; its effects (the
publisher's payout taken back, the buyer's wallet credited, the report, the `lead.returned`
event) happen in the transaction that moves the sale to `returned`, and that move is a
conditional update, so they happen once however returns and approvals race. After it commits,
the buyer's slot is given back in Redis for the windows still current. docs/leads.md "Sales
and returns"."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from webhooks.billing import balance, charges
from webhooks.billing.charges import Charged
from webhooks.billing.wallets import Entry
from webhooks.caps import leases
from webhooks.errors import Conflict, NotFound, ValidationError
from webhooks.events import outbox
from webhooks.formats.validate import cents
from webhooks.leads.accounting import payouts, reports
from webhooks.leads.accounting.ledger import lead_view
from webhooks.leads.rules import earnings
from webhooks.leads.rules.buyers import BuyerRule, ReturnPolicy
from webhooks.storage.live.redis import REDIS_DOWN, Store
from webhooks.storage.records import audit
from webhooks.storage.records.db import db, is_mysql, retried
from webhooks.storage.records.models import Buyer, Lead, LeadReturn, Sale
from webhooks.storage.states import LeadStatus, ReturnStatus, SaleStatus

log = logging.getLogger(__name__)

MAX_REASON = 500
CODE = "invalid_return"


def find(lead_id: str, publisher_id: str | None) -> Lead:
    """The settled lead `lead_id` (of `publisher_id`, needed when several publishers used it)."""
    query = Lead.select().where(Lead.lead_id == lead_id)
    if publisher_id is not None:
        query = query.where(Lead.publisher_id == publisher_id)
    rows = list(query.limit(2))
    if not rows:
        raise NotFound(f"lead {lead_id!r} is not settled (yet)")
    if len(rows) > 1:
        raise Conflict("several publishers used this lead_id; add ?publisher_id=", code="ambiguous_lead_id")
    return rows[0]


@dataclass(frozen=True)
class Returned:
    """What a return request came to: `pending` (manual review: 202) or done (200), and the
    return's id."""

    return_id: str
    pending: bool
    record: dict[str, Any]  # the lead's record (done) or {"return_id", "status"} (pending)


@dataclass(frozen=True)
class _Done:
    """A sale whose return committed: what the steps after the transaction need."""

    sale: Sale
    buyer: Buyer
    charged: Charged | None


def _locked(query: Any) -> Any:
    return query.for_update() if is_mysql() else query


def _sale_of(lead: Lead, buyer_id: str | None) -> Sale:
    """The sale a return names: the buyer's, or the lead's only one (read without a lock: the
    transaction reads it again, locked, once it holds its buyer)."""
    sales = list(Sale.select().where(Sale.publisher_id == lead.publisher_id, Sale.lead_id == lead.lead_id))
    if buyer_id is not None:
        for sale in sales:
            if sale.buyer_id == buyer_id:
                return sale
        if not sales:
            raise Conflict(f"lead {lead.lead_id!r} was not sold", code="not_sold")
        raise NotFound(f"lead {lead.lead_id!r} was not sold to {buyer_id!r}")
    if not sales:
        raise Conflict(f"lead {lead.lead_id!r} was not sold", code="not_sold")
    if len(sales) > 1:
        raise ValidationError(CODE, "buyer_id", "is required: the lead was sold to several buyers")
    return sales[0]


def request_return(
    store: Store,
    lead_id: str,
    publisher_id: str | None,
    reason: str | None,
    *,
    buyer_id: str | None = None,
    now: datetime | None = None,
    actor: str = "admin",
) -> Returned:
    """Return a sale of a lead under its buyer's policy, once. Raises NotFound; ValidationError
    (invalid_return: a reason the policy does not list, buyer_id missing); Conflict:
    already_returned (also while a return of the sale awaits review), not_sold,
    return_window_closed, return_limit (or ambiguous_lead_id)."""
    now = now or datetime.now(timezone.utc)
    naive_now = now.replace(tzinfo=None)
    lead = find(lead_id, publisher_id)
    named = _sale_of(lead, buyer_id)

    def transaction() -> tuple[str, _Done | None]:
        with db.atomic():
            # The buyer's row, locked first: every return of the buyer's sales waits here for
            # the one before to commit, and only then reads (a locking read, and the snapshot
            # of the reads after it starts now), so none counts past `max_pct`. A row lock, as
            # a Galera cluster honours it (never GET_LOCK or LOCK TABLES: docs/cluster.md).
            buyer = _locked(Buyer.select().where(Buyer.id == named.buyer_id)).get()
            sale = _locked(Sale.select().where(Sale.id == named.id)).get()
            if sale.status != SaleStatus.SOLD:
                pending = sale.status == SaleStatus.RETURN_PENDING
                raise Conflict(
                    f"lead {lead_id!r} " + ("has a return awaiting review" if pending else "was returned already"),
                    code="already_returned",
                )
            policy = ReturnPolicy.of(buyer)
            if policy.reasons is not None and reason not in policy.reasons:
                raise ValidationError(CODE, "reason", "must be one of " + ", ".join(policy.reasons))
            if naive_now > sale.sold_at + timedelta(days=policy.window_days):
                raise Conflict(
                    f"lead {lead_id!r} was sold more than {policy.window_days} day(s) ago",
                    code="return_window_closed",
                )
            if policy.max_pct is not None:
                _check_limit(buyer.id, policy, naive_now)
            return_id = "ret_" + secrets.token_hex(12)
            manual = policy.review == "manual"
            LeadReturn.insert(
                return_id=return_id,
                sale_id=sale.id,
                publisher_id=sale.publisher_id,
                lead_id=sale.lead_id,
                buyer_id=sale.buyer_id,
                reason=reason,
                status=ReturnStatus.PENDING if manual else ReturnStatus.APPROVED,
                requested_at=naive_now,
                decided_at=None if manual else naive_now,
                actor=None if manual else audit.who(actor),
            ).execute()
            if manual:
                moved = (
                    Sale.update(status=SaleStatus.RETURN_PENDING)
                    .where(Sale.id == sale.id, Sale.status == SaleStatus.SOLD)
                    .execute()
                )
                if not moved:  # cannot happen under the buyer's lock; kept as the decision itself
                    raise Conflict(f"lead {lead_id!r} was returned already", code="already_returned")
                requested = outbox.EventType.RETURN_REQUESTED
                outbox.emit(outbox.return_event(requested, _event_sale(sale), reason, return_id), naive_now)
                detail = {"return_id": return_id, **_detail(sale), "reason": reason}
                audit.record(actor, "return.requested", "lead", _entity(sale), detail)
                return return_id, None
            charged = _apply(sale, SaleStatus.SOLD, reason, now=naive_now, actor=actor, return_id=return_id)
            return return_id, _Done(sale, buyer, charged)

    # Only the database's writes are in it: run again whole when the database refused it whole.
    return_id, done = retried(transaction, f"returning lead {lead_id}")
    if done is None:
        return Returned(return_id, True, {"return_id": return_id, "status": SaleStatus.RETURN_PENDING.value})
    _after(store, done, now)
    return Returned(return_id, False, {**lead_view(Lead.get_by_id(lead.id)), "return_id": return_id})


def _check_limit(buyer_id: str, policy: ReturnPolicy, now: datetime) -> None:
    """409 return_limit when one more return would put the buyer's returns of the last
    `period_days` (returned in it, or pending review now) over `max_pct` of the sales it bought
    in those days. Called under the buyer's lock, so the count includes every return
    committed before."""
    assert policy.max_pct is not None
    since = now - timedelta(days=policy.period_days)
    sold = Sale.select().where(Sale.buyer_id == buyer_id, Sale.sold_at >= since).count()
    returned = (
        Sale.select()
        .where(
            Sale.buyer_id == buyer_id,
            ((Sale.status == SaleStatus.RETURNED) & (Sale.returned_at >= since))
            | (Sale.status == SaleStatus.RETURN_PENDING),
        )
        .count()
    )
    if (returned + 1) * 100 > policy.max_pct * sold:
        raise Conflict(
            f"returns are limited to {policy.max_pct}% of the buyer's sales of the last {policy.period_days}"
            f" day(s): {returned} returned of {sold} sold",
            code="return_limit",
        )


def _apply(
    sale: Sale, current: SaleStatus, reason: str | None, *, now: datetime, actor: str, return_id: str
) -> Charged | None:
    """The effects of a return, in the caller's transaction, once: the sale (read under its row
    lock) moves from `current` to returned by a conditional update (a concurrent return or
    approval that moved it first makes this one a 409), then the payout (cancelled while held,
    else taken back from the balance: payouts.on_return), wallet, report, lead row, event and
    audit row."""
    won = (
        Sale.update(status=SaleStatus.RETURNED, returned_at=now, return_reason=reason)
        .where(Sale.id == sale.id, Sale.status == current, Sale.payout_state == sale.payout_state)
        .execute()
    )
    if not won:
        raise Conflict(f"lead {sale.lead_id!r} was returned already", code="already_returned")
    state = payouts.on_return(sale, now)
    if state != sale.payout_state:
        Sale.update(payout_state=state).where(Sale.id == sale.id).execute()
    lead = Lead.get(Lead.publisher_id == sale.publisher_id, Lead.lead_id == sale.lead_id)
    reports.count_returned(lead, price=sale.price, payout=sale.payout, buyer_id=sale.buyer_id)
    kept = Sale.select().where(
        Sale.publisher_id == sale.publisher_id,
        Sale.lead_id == sale.lead_id,
        Sale.status != SaleStatus.RETURNED,
    )
    if not kept.exists():  # its last sale returned: the lead itself is returned
        Lead.update(status=LeadStatus.RETURNED, returned_at=now, return_reason=reason).where(
            Lead.id == lead.id, Lead.status == LeadStatus.SOLD
        ).execute()
    charged = None
    if sale.charge_account is not None and sale.charge_minor is not None:
        charged = Charged(sale.charge_account, int(sale.charge_minor))
        account, currency = charged.wallet  # a billed sale: exactly what it debited goes back
        charges.move(account, currency, charged.minor, now, entry=Entry.RETURN, reference=_entity(sale))
    returned = outbox.EventType.LEAD_RETURNED
    outbox.emit(outbox.return_event(returned, _event_sale(sale), reason, return_id), now)
    audit.record(actor, "lead.returned", "lead", _entity(sale), {**_detail(sale), "reason": reason})
    return charged


def _entity(sale: Sale) -> str:
    return f"{sale.publisher_id}:{sale.lead_id}"


def _detail(sale: Sale) -> dict[str, Any]:
    return {"buyer_id": sale.buyer_id, "price": sale.price, "commission": sale.payout}


def _event_sale(sale: Sale) -> outbox.SaleOf:
    return outbox.SaleOf(
        publisher_id=sale.publisher_id,
        lead_id=sale.lead_id,
        buyer_id=sale.buyer_id,
        price=f"{Decimal(sale.price):.2f}",
        payout=f"{Decimal(sale.payout or 0):.2f}",
    )


def _after(store: Store, done: _Done, now: datetime) -> None:
    """After a return committed: the buyer's balance in Redis, and its cap slot given back."""
    rule = BuyerRule.from_row(done.buyer)
    if done.charged is not None and rule.billing is not None and rule.billing.key == done.charged.account:
        balance.sync(store, rule.id, rule.billing)
    given_back = _give_back_slot(store, rule, done.sale, now)
    sale = done.sale  # its price out of what its buyer earned (`epl` routing)
    earnings.count(
        store.redis, [earnings.returned(sale.publisher_id, sale.buyer_id, Decimal(sale.price), sale.sold_at)]
    )
    log.info(
        "lead %s returned by %s; cap slot given back in %s",
        _entity(done.sale),
        done.sale.buyer_id,
        ", ".join(given_back) or "no current window",
    )


# --- review: a manual policy's returns wait for an operator --------------------------------------


def pending(limit: int = 100, *, buyer_id: str | None = None, publisher_id: str | None = None) -> list[dict[str, Any]]:
    """Returns awaiting review, oldest first (of one buyer, or of one publisher's leads, when
    named), each with its sale and the buyer's reason."""
    query = LeadReturn.select().where(LeadReturn.status == ReturnStatus.PENDING)
    if buyer_id is not None:
        query = query.where(LeadReturn.buyer_id == buyer_id)
    if publisher_id is not None:
        query = query.where(LeadReturn.publisher_id == publisher_id)
    rows = list(query.order_by(LeadReturn.requested_at, LeadReturn.id).limit(limit))
    sales = {s.id: s for s in Sale.select().where(Sale.id.in_([r.sale_id for r in rows]))} if rows else {}
    out = []
    for r in rows:
        sale = sales.get(r.sale_id)
        out.append(
            {
                "return_id": r.return_id,
                "publisher_id": r.publisher_id,
                "lead_id": r.lead_id,
                "buyer_id": r.buyer_id,
                "reason": r.reason,
                "requested_at": r.requested_at.isoformat() + "Z",
                "price": None if sale is None else f"{Decimal(sale.price):.2f}",
                "sold_at": None if sale is None else sale.sold_at.isoformat() + "Z",
            }
        )
    return out


def decide(
    store: Store, return_id: str, *, approve: bool, now: datetime | None = None, actor: str = "admin"
) -> dict[str, Any]:
    """Approve (the return's effects, once) or reject (the sale sold again) a pending return;
    the return as it stands after. NotFound for an unknown id; Conflict not_pending when it
    was decided already (by a concurrent decision too: one conditional update decides)."""
    now = now or datetime.now(timezone.utc)
    naive_now = now.replace(tzinfo=None)

    def transaction() -> tuple[LeadReturn, _Done | None]:
        with db.atomic():
            ret = LeadReturn.get_or_none(LeadReturn.return_id == return_id)
            if ret is None:
                raise NotFound(f"no return {return_id!r}")
            status = ReturnStatus.APPROVED if approve else ReturnStatus.REJECTED
            won = (
                LeadReturn.update(status=status, decided_at=naive_now, actor=audit.who(actor))
                .where(LeadReturn.id == ret.id, LeadReturn.status == ReturnStatus.PENDING)
                .execute()
            )
            if not won:
                raise Conflict(f"return {return_id!r} was decided already", code="not_pending")
            sale = _locked(Sale.select().where(Sale.id == ret.sale_id)).get()
            if approve:
                charged = _apply(
                    sale, SaleStatus.RETURN_PENDING, ret.reason, now=naive_now, actor=actor, return_id=return_id
                )
                return ret, _Done(sale, Buyer.get_by_id(sale.buyer_id), charged)
            moved = (
                Sale.update(status=SaleStatus.SOLD)
                .where(Sale.id == sale.id, Sale.status == SaleStatus.RETURN_PENDING)
                .execute()
            )
            if not moved:  # only its pending return moves a sale out of return_pending
                raise Conflict(f"return {return_id!r} was decided already", code="not_pending")
            rejected = outbox.EventType.RETURN_REJECTED
            outbox.emit(outbox.return_event(rejected, _event_sale(sale), ret.reason, return_id), naive_now)
            audit.record(actor, "return.rejected", "lead", _entity(sale), {"return_id": return_id, **_detail(sale)})
            return ret, None

    ret, done = retried(transaction, f"deciding return {return_id}")
    if done is not None:
        _after(store, done, now)
    return {
        "return_id": return_id,
        "status": ReturnStatus.APPROVED.value if approve else ReturnStatus.REJECTED.value,
        "publisher_id": ret.publisher_id,
        "lead_id": ret.lead_id,
        "buyer_id": ret.buyer_id,
        "reason": ret.reason,
    }


def _give_back_slot(store: Store, buyer: BuyerRule, sale: Sale, now: datetime) -> list[str]:
    """Decrement the counters of the sale's windows that are still current; their names."""
    sold_at = sale.sold_at.replace(tzinfo=timezone.utc)
    then = {cap: w for cap, _, w in leases.windows(buyer, sold_at)}
    current = [(cap, w) for cap, _, w in leases.windows(buyer, now) if then.get(cap) == w]
    if not current:
        return []
    try:
        given = store.give_back(
            buyer.id,
            [
                (leases.counter_key(buyer.id, w), cents(sale.price) if cap == "daily_budget" else 1)
                for cap, w in current
            ],
        )
    except REDIS_DOWN as exc:  # the ledger is right; reconciliation gives the slot back
        log.warning("return of %s: slot not given back now (%s); reconciliation will", _entity(sale), exc)
        return []
    if not given:
        log.info("return of %s: a reconciliation of %s is running; it gives the slot back", _entity(sale), buyer.id)
        return []
    return [cap for cap, _ in current]
