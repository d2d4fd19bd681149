"""Lead returns (docs/api.md "Lead returns"): a buyer sends back a lead it bought, within its
`return_window_days`. One conditional ledger update decides a race; the same transaction takes
the publisher's payout back and writes the `lead.returned` event; after it commits, the
buyer's slot is given back in Redis for the windows still current. docs/leads.md
"Duplicates, the routing trace and returns"."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

from webhooks.billing import balance, charges
from webhooks.billing.charges import Charged
from webhooks.billing.wallets import Entry
from webhooks.caps import leases
from webhooks.errors import Conflict, NotFound
from webhooks.events import outbox
from webhooks.formats.validate import cents
from webhooks.leads.accounting import reports
from webhooks.leads.accounting.ledger import lead_view
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage.live.redis import REDIS_DOWN, Store
from webhooks.storage.records import audit
from webhooks.storage.records.db import db, retried
from webhooks.storage.records.models import Buyer, Lead, Publisher
from webhooks.storage.states import LeadStatus

log = logging.getLogger(__name__)

MAX_REASON = 500


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


def return_lead(
    store: Store,
    lead_id: str,
    publisher_id: str | None,
    reason: str | None,
    *,
    now: datetime | None = None,
    actor: str = "admin",
) -> dict[str, Any]:
    """Return a sold lead exactly once; the lead record after it. Raises NotFound, or
    Conflict: already_returned, not_sold, return_window_closed (or ambiguous_lead_id)."""
    now = now or datetime.now(timezone.utc)
    naive_now = now.replace(tzinfo=None)

    def transaction() -> tuple[Lead, Buyer, Charged | None]:
        with db.atomic():
            lead = find(lead_id, publisher_id)
            if lead.status == LeadStatus.RETURNED:
                raise Conflict(f"lead {lead_id!r} was returned already", code="already_returned")
            if lead.status != LeadStatus.SOLD:
                raise Conflict(f"lead {lead_id!r} was not sold", code="not_sold")
            buyer = Buyer.get_by_id(lead.buyer_id)
            if naive_now > lead.sold_at + timedelta(days=buyer.return_window_days):
                raise Conflict(
                    f"lead {lead_id!r} was sold more than {buyer.return_window_days} day(s) ago",
                    code="return_window_closed",
                )
            won = (
                Lead.update(status=LeadStatus.RETURNED, returned_at=naive_now, return_reason=reason)
                .where(Lead.id == lead.id, Lead.status == LeadStatus.SOLD)
                .execute()
            )
            if not won:  # a concurrent return committed first
                raise Conflict(f"lead {lead_id!r} was returned already", code="already_returned")
            if lead.payout:
                taken_back = Publisher.update(balance=Publisher.balance - lead.payout)
                taken_back.where(Publisher.id == lead.publisher_id).execute()
            reports.count_returned(lead)
            charged = _charged(lead)
            if charged is not None:  # a billed sale: exactly what it debited goes back to its wallet
                account, currency = charged.wallet
                ref = f"{lead.publisher_id}:{lead.lead_id}"
                charges.move(account, currency, charged.minor, naive_now, entry=Entry.RETURN, reference=ref)
            payout = f"{lead.payout or 0:.2f}"
            returned = outbox.EventType.LEAD_RETURNED
            outbox.emit(outbox.lead_event(returned, lead.publisher_id, lead.lead_id, payout, reason), naive_now)
            audit.record(
                actor,
                "lead.returned",
                "lead",
                f"{lead.publisher_id}:{lead.lead_id}",
                {"buyer_id": lead.buyer_id, "price": lead.price, "commission": lead.payout, "reason": reason},
            )
        return lead, buyer, charged

    # Only the database's writes are in it: run again whole when the database refused it whole.
    lead, buyer, charged = retried(transaction, f"returning lead {lead_id}")
    rule = BuyerRule.from_row(buyer)
    if charged is not None and rule.billing is not None and rule.billing.key == charged.account:
        balance.sync(store, rule.id, rule.billing)
    given_back = _give_back_slot(store, rule, lead, now)
    log.info(
        "lead %s:%s returned by %s; cap slot given back in %s",
        lead.publisher_id,
        lead.lead_id,
        lead.buyer_id,
        ", ".join(given_back) or "no current window",
    )
    return lead_view(Lead.get_by_id(lead.id))


def _charged(lead: Lead) -> Charged | None:
    if lead.charge_account is None or lead.charge_minor is None:
        return None
    return Charged(lead.charge_account, int(lead.charge_minor))


def _give_back_slot(store: Store, buyer: BuyerRule, lead: Lead, now: datetime) -> list[str]:
    """Decrement the counters of the sale's windows that are still current; their names."""
    sold_at = lead.sold_at.replace(tzinfo=timezone.utc)
    then = {cap: w for cap, _, w in leases.windows(buyer, sold_at)}
    current = [(cap, w) for cap, _, w in leases.windows(buyer, now) if then.get(cap) == w]
    if not current:
        return []
    assert lead.price is not None  # a sold lead has its price
    try:
        given = store.give_back(
            buyer.id,
            [
                (leases.counter_key(buyer.id, w), cents(lead.price) if cap == "daily_budget" else 1)
                for cap, w in current
            ],
        )
    except REDIS_DOWN as exc:  # the ledger is right; reconciliation gives the slot back
        log.warning(
            "return of %s:%s: slot not given back now (%s); reconciliation will", lead.publisher_id, lead.lead_id, exc
        )
        return []
    if not given:
        log.info(
            "return of %s:%s: a reconciliation of %s is running; it gives the slot back",
            lead.publisher_id,
            lead.lead_id,
            buyer.id,
        )
        return []
    return [cap for cap, _ in current]
