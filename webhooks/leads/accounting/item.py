"""The settlement item: what a routed lead leaves for the ledger, and its JSON on the settlement
list. The JSON is a contract between releases (a web process of one release queues, a worker
of the next may settle): its keys, their order and their formatting stay as they are, and
`from_json` reads every item an earlier release queued (keys it added later may be absent).
A key added is written only when it has something to say (`charge`, `consent`, `more_sales`):
every other item reads as before. A release that knows no `more_sales` settles a shared lead's
first sale only, so workers are upgraded before the web processes that sell shared leads
(docs/operations.md "Deploying")."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhooks.storage.states import LeadStatus


@dataclass(frozen=True, kw_only=True, slots=True)
class SaleLine:
    """One sale of a settled lead: the first is the item's own fields; a shared lead's further
    sales are its `more_sales`, each in the JSON as the item carries its first."""

    buyer_id: str
    price: str  # decimal strings with two places
    payout: str | None
    sold_at: str | None
    lease: tuple[str, str] | None = None  # (buyer_id, lease_id)
    reserved_us: int | None = None
    charge: tuple[str, int] | None = None  # a billed sale's (wallet, minor units)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "buyer_id": self.buyer_id,
            "price": self.price,
            "commission": self.payout,
            "sold_at": self.sold_at,
            "lease": None if self.lease is None else list(self.lease),
            "reserved_us": self.reserved_us,
        }
        if self.charge is not None:
            out["charge"] = list(self.charge)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SaleLine:
        lease = d.get("lease")
        return cls(
            buyer_id=d["buyer_id"],
            price=d["price"],
            payout=d.get("commission"),
            sold_at=d.get("sold_at"),
            lease=None if not lease else (lease[0], lease[1]),
            reserved_us=d.get("reserved_us"),
            charge=None if not d.get("charge") else (str(d["charge"][0]), int(d["charge"][1])),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class SettlementItem:
    publisher_id: str
    lead_id: str
    status: str  # a LeadStatus (test_sold / test_unsold for a test lead)
    buyer_id: str | None
    price: str | None  # decimal strings with two places, as queued
    payout: str | None  # what the publisher earns for the sale ("commission" in the JSON and the ledger)
    attempts: tuple[Mapping[str, Any], ...]
    skipped: tuple[Mapping[str, Any], ...]  # the routing trace: buyers not attempted, why
    payload: str  # the lead's body as posted
    received_at: str  # ISO 8601, aware UTC
    sold_at: str | None = None
    lease: tuple[str, str] | None = None  # (buyer_id, lease_id) of the sale
    reserved_us: int | None = None
    request_id: str | None = None
    payload_dropped: bool = False  # re-pushed by a journal whose memory budget dropped the body
    # a billed sale: (the wallet "<account>|<currency>", what it debits in minor units)
    charge: tuple[str, int] | None = None
    consent: tuple[Mapping[str, Any], ...] = ()  # the consent claims made for the lead
    more_sales: tuple[SaleLine, ...] = ()  # a shared lead's sales after its first (the fields above)

    @property
    def sold(self) -> bool:
        return self.status == LeadStatus.SOLD

    def sales(self) -> tuple[SaleLine, ...]:
        """Every sale of the lead, its first (the item's own fields) first; none unless sold."""
        if self.status != LeadStatus.SOLD or self.buyer_id is None or self.price is None:
            return ()
        first = SaleLine(
            buyer_id=self.buyer_id,
            price=self.price,
            payout=self.payout,
            sold_at=self.sold_at,
            lease=self.lease,
            reserved_us=self.reserved_us,
            charge=self.charge,
        )
        return (first, *self.more_sales)

    def to_dict(self) -> dict[str, Any]:
        """The item as its JSON holds it: keys in their queued order, "payload_dropped" only when set."""
        out: dict[str, Any] = {
            "publisher_id": self.publisher_id,
            "lead_id": self.lead_id,
            "status": self.status,
            "buyer_id": self.buyer_id,
            "price": self.price,
            "commission": self.payout,
            "attempts": [dict(a) for a in self.attempts],
            "skipped": [dict(s) for s in self.skipped],
            "payload": self.payload,
            "received_at": self.received_at,
            "sold_at": self.sold_at,
            "lease": None if self.lease is None else list(self.lease),
            "reserved_us": self.reserved_us,
            "request_id": self.request_id,
        }
        if self.payload_dropped:
            out["payload_dropped"] = True
        if self.charge is not None:  # only on billed sales: every other item reads as before
            out["charge"] = list(self.charge)
        if self.consent:  # only when a claim was made or looked for
            out["consent"] = [dict(c) for c in self.consent]
        if self.more_sales:  # only on a lead sold to several buyers
            out["more_sales"] = [s.to_dict() for s in self.more_sales]
        return out

    def to_json(self) -> str:
        """As it is queued: compact, UTF-8 as is (escaping it would triple an emoji-heavy lead)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SettlementItem:
        """An item as any release queued it; keys this one does not know are left out."""
        lease = d.get("lease")
        return cls(
            publisher_id=d["publisher_id"],
            lead_id=d["lead_id"],
            status=d["status"],
            buyer_id=d["buyer_id"],
            price=d["price"],
            payout=d["commission"],
            attempts=tuple(d.get("attempts") or ()),
            skipped=tuple(d.get("skipped") or ()),
            payload=d["payload"],
            received_at=d["received_at"],
            sold_at=d.get("sold_at"),
            lease=None if not lease else (lease[0], lease[1]),
            reserved_us=d.get("reserved_us"),
            request_id=d.get("request_id"),
            payload_dropped=bool(d.get("payload_dropped", False)),
            charge=None if not d.get("charge") else (str(d["charge"][0]), int(d["charge"][1])),
            consent=tuple(d.get("consent") or ()),
            more_sales=tuple(SaleLine.from_dict(s) for s in d.get("more_sales") or ()),
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> SettlementItem:
        return cls.from_dict(json.loads(raw))


def skipped_for_balance(items: Iterable[SettlementItem]) -> set[str]:
    """The buyers these leads skipped because they could not afford them."""
    return {
        s["buyer_id"]
        for item in items
        for s in item.skipped
        if s.get("reason") == "balance" and isinstance(s.get("buyer_id"), str)
    }
