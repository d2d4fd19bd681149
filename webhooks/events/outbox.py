"""The outbox: an event row per announced change, inserted in the caller's transaction, so an
event exists exactly when the change it announces committed (none for a change rolled back,
none lost for one that committed). The body is fixed here; the sending engine (sender.py)
sends it as it is to every endpoint that wants it.

Events of one entity (a wallet's customer, a lead) are sent to each endpoint in the order
of their ids. A change inserts its event while it holds the entity's row lock (the wallet's
upsert, the lead's conditional update), so for one entity ids follow commits."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from webhooks.storage.records import fastsql
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Event


class EventType(StrEnum):
    """An event's `type` (docs/api.md "Event endpoints")."""

    WALLET_CREDITED = "wallet.credited"
    WALLET_DEBITED = "wallet.debited"
    LEAD_SOLD = "lead.sold"
    LEAD_RETURNED = "lead.returned"
    RETURN_REQUESTED = "return.requested"  # a return of a sale awaits an operator's review
    RETURN_REJECTED = "return.rejected"
    BUYER_BALANCE_LOW = "buyer.balance_low"
    BUYER_BALANCE_DEPLETED = "buyer.balance_depleted"


WALLET_TYPES = (EventType.WALLET_CREDITED, EventType.WALLET_DEBITED)
LEAD_TYPES = (EventType.LEAD_SOLD, EventType.LEAD_RETURNED, EventType.RETURN_REQUESTED, EventType.RETURN_REJECTED)
# what a publisher's endpoint gets when it names no types: the two it always got
PUBLISHER_DEFAULT_TYPES = (EventType.LEAD_SOLD, EventType.LEAD_RETURNED)


@dataclass(frozen=True)
class NewEvent:
    """An event to insert: its type, the change it announces (`subject`: one event per type and
    subject), the entity whose events go out in order, and its `data`."""

    type: EventType
    subject: str
    entity: str
    data: dict[str, Any]
    publisher_id: str | None = None  # lead events: an endpoint of this publisher wants them

    def row(self, now: datetime) -> dict[str, Any]:
        return {
            "event_id": new_id(),
            "type": self.type,
            "subject": self.subject[:200],
            "entity": self.entity[:254],
            "publisher_id": self.publisher_id,
            "body": json.dumps({"type": self.type, "data": self.data}, separators=(",", ":")),
            "created_at": now,
            "fanned_out": False,
        }


def new_id() -> str:
    """A fresh `msg_` id (the Standard Webhooks convention for a webhook-id)."""
    return "msg_" + secrets.token_hex(16)


def emit(event: NewEvent, now: datetime, deferred: bool = False) -> None:
    """Insert one event, in the caller's transaction (`deferred`: see fastsql.insert)."""
    fastsql.insert(Event, event.row(now), deferred)


# A wallet event's body ends with its balance (wallet_event puts it last), written as 0 here
# and computed by the INSERT itself in emit_with_balance.
_BALANCE_LAST = '"balance_minor":0}}'


def emit_with_balance(event: NewEvent, now: datetime, balance_sql: str, params: Sequence[object]) -> None:
    """Insert a wallet event whose `balance_minor` is the SQL expression `balance_sql` (with
    `params`), evaluated by the INSERT (MySQL only; ledger.top_up's reads what the wallet's
    upsert just before it left), in the caller's transaction: the transaction needs no answer
    before its COMMIT, so every statement of it travels in one round trip (the statement is
    deferred, see fastsql.insert), and the wallet's row lock is held for no round trip to the
    web process. `event` is wallet_event's with a balance of 0."""
    row = event.row(now)
    body: str = row.pop("body")
    if not body.endswith(_BALANCE_LAST):
        raise ValueError(f"not a wallet event with its balance last: {event.type}")
    head, tail = body[: -len("0}}")], "}}"
    names = tuple(row)
    fields = [Event._meta.fields[name] for name in names]
    columns = ", ".join(f"`{f.column_name}`" for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO `events` ({columns}, `body`) VALUES ({marks}, CONCAT(%s, {balance_sql}, %s))"
    values = [f.db_value(row[f.name]) for f in fields]
    db.obj.defer(sql, [*values, head, *params, tail])


def emit_many(new: list[NewEvent], now: datetime) -> None:
    """Insert several events with one statement, in the caller's transaction."""
    if new:
        fastsql.insert_many(Event, [e.row(now) for e in new])


def emit_once(new: list[NewEvent], now: datetime) -> int:
    """Insert the events whose type and subject have none yet (the unique key decides: a
    repeat, or another process writing the same, is left out), with one statement, in the
    caller's transaction; return how many were new."""
    if not new:
        return 0
    query = Event.insert_many([e.row(now) for e in new]).on_conflict_ignore()
    return int(db.execute(query).rowcount)


def wallet_event(
    kind: EventType,
    *,
    provider: str,
    reference: str,
    customer: str,
    currency: str,
    amount_minor: int,
    balance_minor: int,
) -> NewEvent:
    """A wallet change's event (docs/api.md "Payment events to your application"): in order per customer."""
    data = {
        "provider": provider,
        "reference": reference,
        "customer": customer,
        "currency": currency,
        "amount_minor": amount_minor,
        "balance_minor": balance_minor,
    }
    return NewEvent(kind, f"{provider}:{reference}", customer, data)


def sold_event(
    publisher_id: str, lead_id: str, *, payout: str, buyer_id: str | None, price: str | None, nth: int = 0
) -> NewEvent:
    """A lead's sale (`payout`: the publisher's, `price`: the buyer's, decimal strings): in
    order per lead, one per sale. The first sale's subject is the lead (as before shared
    leads); a shared lead's `nth` further sale's names its buyer too."""
    data: dict[str, Any] = {
        "lead_id": lead_id,
        "publisher_id": publisher_id,
        "payout": payout,
        "buyer_id": buyer_id,
        "price": price,
    }
    key = f"{publisher_id}:{lead_id}"
    subject = key if nth == 0 else f"{key}:{buyer_id}"
    return NewEvent(EventType.LEAD_SOLD, subject, key, data, publisher_id)


@dataclass(frozen=True, kw_only=True)
class SaleOf:
    """Which sale a return event is about, and what it was worth."""

    publisher_id: str
    lead_id: str
    buyer_id: str
    price: str  # decimal strings
    payout: str


def return_event(kind: EventType, sale: SaleOf, reason: str | None, return_id: str | None) -> NewEvent:
    """A sale's return asked, rejected, or done (lead.returned): in order per lead, one of each
    type per sale and return (a sale is returned once; asked and rejected once per return)."""
    data: dict[str, Any] = {
        "lead_id": sale.lead_id,
        "publisher_id": sale.publisher_id,
        "payout": sale.payout,
        "reason": reason,
        "buyer_id": sale.buyer_id,
        "price": sale.price,
    }
    if kind != EventType.LEAD_RETURNED:  # a review's events name the return they are about
        data["return_id"] = return_id
    key = f"{sale.publisher_id}:{sale.lead_id}"
    subject = f"{key}:{sale.buyer_id}" if kind == EventType.LEAD_RETURNED else f"{key}:{return_id}"
    return NewEvent(kind, subject, key, data, sale.publisher_id)


def buyer_event(kind: EventType, *, buyer_id: str, wallet: str, cycle: int, available: str) -> NewEvent:
    """A billed buyer's balance event (`wallet`: "<account>|<currency>", `available`: a decimal
    string): one per buyer, wallet and cycle of its balance, in order with the wallet's events."""
    account, currency = wallet.rsplit("|", 1)
    data = {"buyer_id": buyer_id, "currency": currency, "available": available}
    subject = f"{buyer_id}:{cycle}:{wallet}"
    if len(subject) > 200:  # the column's width: a long account by its digest
        subject = f"{buyer_id}:{cycle}:" + hashlib.sha256(wallet.encode()).hexdigest()
    return NewEvent(kind, subject, account, data)
