"""A shared lead's settlement (docs/api.md "Sales: one lead to several buyers, return policies,
payout holds"): its item's JSON carrying the further sales, and the ledger writing a sale,
payout, debit, report figures and lead.sold event per sale, once, against the real database
and Redis; returning one of its sales leaves the others standing."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from webhooks import services
from webhooks.billing.charges import Charged
from webhooks.caps import leases, sales
from webhooks.leads.accounting import ledger, payouts, returns
from webhooks.leads.accounting.item import SaleLine, SettlementItem
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome, Sold
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.live import settle_queue
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Event, Lead, Publisher, Sale, Wallet

PUB = PublisherRule(id="surge", active=True, payout_pct=Decimal("10"), max_sales=3)
NOW = datetime.now(timezone.utc).replace(microsecond=123456)
PRICES = {"s1": "12.00", "s2": "9.50", "s3": "8.00"}


def _outcome(sold_at: datetime, charges: dict[str, Charged] | None = None, lead_id: str = "L1") -> Outcome:
    charges = charges or {}
    out = Outcome(
        attempts=[
            {"buyer_id": "ex", "outcome": "rejected", "ms": 11},
            *({"buyer_id": b, "outcome": "accepted", "ms": 30} for b in PRICES),
        ]
    )
    out.sell(
        [
            Sold(b, Decimal(p), leases.Lease(b, f"lease-{lead_id}-{b}", (), reserved_us=1_000 + i), charges.get(b))
            for i, (b, p) in enumerate(PRICES.items())
        ],
        sold_at,
    )
    return out


def _item(lead_id: str = "L1", sold_at: datetime = NOW, charges: dict[str, Charged] | None = None) -> SettlementItem:
    return settlement.make_item(
        publisher=PUB,
        lead_id=lead_id,
        outcome=_outcome(sold_at, charges, lead_id),
        payload='{"lead_id": "%s"}' % lead_id,
        received_at=sold_at,
        request_id="req-1",
    )


# --- the item's JSON -----------------------------------------------------------------------------


def test_a_shared_lead_s_item_carries_its_further_sales_and_reads_back_the_same():
    item = _item(charges={"s2": Charged("acct-s2|NGN", 950)})
    assert (item.buyer_id, item.price, item.payout, item.lease) == ("s1", "12.00", "1.20", ("s1", "lease-L1-s1"))
    raw = json.loads(item.to_json())
    assert list(raw)[-1] == "more_sales"
    assert raw["more_sales"] == [
        {
            "buyer_id": "s2",
            "price": "9.50",
            "commission": "0.95",
            "sold_at": NOW.isoformat(),
            "lease": ["s2", "lease-L1-s2"],
            "reserved_us": 1001,
            "charge": ["acct-s2|NGN", 950],
        },
        {
            "buyer_id": "s3",
            "price": "8.00",
            "commission": "0.80",
            "sold_at": NOW.isoformat(),
            "lease": ["s3", "lease-L1-s3"],
            "reserved_us": 1002,
        },
    ]
    back = SettlementItem.from_json(item.to_json())
    assert back == item and back.to_json() == item.to_json()
    assert [(s.buyer_id, s.price, s.payout) for s in back.sales()] == [
        ("s1", "12.00", "1.20"),
        ("s2", "9.50", "0.95"),
        ("s3", "8.00", "0.80"),
    ]
    assert [s["buyer_id"] for s in settle_queue.sales_in(raw)] == ["s1", "s2", "s3"]
    assert settlement.answer_of(item)["sales"] == [{"buyer_id": b, "price": p} for b, p in PRICES.items()]


def test_an_item_without_further_sales_has_no_such_key():
    one = Outcome(
        status="sold", buyer_id="s1", price=Decimal("12.00"), sold_at=NOW, lease=leases.Lease("s1", "lease-x", ())
    )
    sold = settlement.make_item(
        publisher=PUB, lead_id="X1", outcome=one, payload="{}", received_at=NOW, request_id=None
    )
    unsold = settlement.make_item(
        publisher=PUB, lead_id="X2", outcome=Outcome(), payload="{}", received_at=NOW, request_id=None
    )
    for item in (sold, unsold):
        assert "more_sales" not in json.loads(item.to_json())
        assert SettlementItem.from_json(item.to_json()) == item
    assert [s.buyer_id for s in sold.sales()] == ["s1"] and unsold.sales() == ()
    assert settlement.answer_of(sold)["sales"] == [{"buyer_id": "s1", "price": "12.00"}]
    assert "sales" not in settlement.answer_of(unsold)
    line = SaleLine(buyer_id="s2", price="1.00", payout=None, sold_at=None)
    assert SaleLine.from_dict(line.to_dict()) == line and "charge" not in line.to_dict()


# --- the ledger ----------------------------------------------------------------------------------


@pytest.fixture
def shared(api, buyer_server):
    """Publisher surge (10 %, payouts held 7 days) and shared buyers s1 s2 s3 (returns allowed)."""
    api.put_publisher("surge", commission_pct="10", payout_hold_days=7, sell={"max_sales": 3})
    for priority, (b, price) in enumerate(PRICES.items(), 1):
        buyer_server.add(b)
        api.put_buyer(
            b, buyer_server.url(b), priority=priority, price=price, contract="shared", returns={"window_days": 30}
        )
    api.settle_config()


def _settle(*items: SettlementItem) -> int:
    with db.connection_context():
        return ledger.settle(items)


def _books(api) -> dict:
    """Everything settling a lead writes, as the database and the admin API show it."""
    with db.connection_context():
        rows = [
            (s.buyer_id, f"{s.price:.2f}", f"{s.payout:.2f}", s.status, s.payout_state, s.lease_id, s.charge_minor)
            for s in Sale.select().order_by(Sale.id)
        ]
        events = [(e.type, e.subject, json.loads(e.body)["data"]) for e in Event.select().order_by(Event.id)]
        publisher = Publisher.get_by_id("surge")
        money = (f"{publisher.balance:.2f}", f"{publisher.payout_held:.2f}")
        wallets = {w.customer: w.balance_minor for w in Wallet.select()}
        leads = [(x.lead_id, x.status, x.buyer_id) for x in Lead.select().order_by(Lead.id)]
    day = NOW.date().isoformat()
    report = api.get("/v1/admin/reports/leads", params={"from": day, "to": day, "group_by": "buyer"}).json()
    return {"sales": rows, "events": events, "money": money, "wallets": wallets, "leads": leads, "report": report}


def _row(report: dict, key: str) -> dict:
    [row] = [r for r in report["rows"] if r["key"] == key]
    return {k: row[k] for k in ("leads", "sold", "unsold", "sales", "returned", "revenue", "payout")}


def test_settling_a_three_sale_lead_writes_each_sale_once(api, shared):
    item = _item(charges={"s2": Charged("acct-s2|NGN", 950)})
    assert _settle(item) == 1
    books = _books(api)
    assert books["sales"] == [
        ("s1", "12.00", "1.20", "sold", "held", "lease-L1-s1", None),
        ("s2", "9.50", "0.95", "sold", "held", "lease-L1-s2", 950),
        ("s3", "8.00", "0.80", "sold", "held", "lease-L1-s3", None),
    ]
    assert books["leads"] == [("L1", "sold", "s1")]
    assert books["money"] == ("0.00", "2.95")  # every payout held for 7 days
    assert books["wallets"] == {"acct-s2": -950}
    sold = [e for e in books["events"] if e[0] == "lead.sold"]
    assert [subject for _, subject, _ in sold] == ["surge:L1", "surge:L1:s2", "surge:L1:s3"]
    assert [(d["buyer_id"], d["price"], d["payout"]) for _, _, d in sold] == [
        ("s1", "12.00", "1.20"),
        ("s2", "9.50", "0.95"),
        ("s3", "8.00", "0.80"),
    ]
    report = books["report"]
    assert _row(report, "s1") == {
        "leads": 1,
        "sold": 1,
        "unsold": 0,
        "sales": 1,
        "returned": 0,
        "revenue": "12.00",
        "payout": "1.20",
    }
    for b in ("s2", "s3"):
        zero = {"leads": 0, "sold": 0, "unsold": 0, "sales": 1, "returned": 0}
        assert _row(report, b) == {**zero, "revenue": PRICES[b], "payout": f"{Decimal(PRICES[b]) / 10:.2f}"}
    assert {k: report["totals"][k] for k in ("leads", "sold", "sales", "revenue")} == {
        "leads": 1,
        "sold": 1,
        "sales": 3,
        "revenue": "29.50",
    }
    record = api.get("/v1/admin/leads/L1?publisher_id=surge").json()
    assert [(s["buyer_id"], s["price"], s["payout"], s["status"]) for s in record["sales"]] == [
        ("s1", "12.00", "1.20", "sold"),
        ("s2", "9.50", "0.95", "sold"),
        ("s3", "8.00", "0.80", "sold"),
    ]
    statement = api.get(f"/v1/admin/publishers/surge/statement?month={NOW:%Y-%m}").json()
    assert (statement["earned"], statement["held"], statement["payable"]) == ("2.95", "2.95", "0.00")
    assert [(x["kind"], x["buyer_id"], x["amount"]) for x in statement["lines"]] == [
        ("held", "s1", "1.20"),
        ("held", "s2", "0.95"),
        ("held", "s3", "0.80"),
    ]
    with db.connection_context():
        assert ledger.answer_for("surge", "L1")["sales"] == [{"buyer_id": b, "price": p} for b, p in PRICES.items()]

    assert _settle(item) == 0  # the job run again
    assert _settle(item, _item("L2")) == 1  # a batch with it settled before: lead by lead
    again = _books(api)
    assert [s for s in again["sales"] if s[5].startswith("lease-L1-")] == books["sales"]
    assert [e for e in again["events"] if not e[1].startswith("surge:L2")] == books["events"]
    assert again["wallets"] == books["wallets"]
    assert again["money"] == ("0.00", "5.90")  # L2's payouts only
    assert _row(again["report"], "s1")["leads"] == 2 and _row(again["report"], "s2")["sales"] == 2
    with db.connection_context():
        assert payouts.release((NOW + timedelta(days=7, seconds=1)).replace(tzinfo=None)) == 6  # each sale's
    assert _books(api)["money"] == ("5.90", "0.00")


def test_returning_one_sale_leaves_the_lead_sold_and_its_other_sales_as_they_were(api, app, shared):
    _settle(_item(charges={"s2": Charged("acct-s2|NGN", 950)}))
    store = services.of(app).store
    now = NOW + timedelta(minutes=5)

    def ret(buyer_id: str):
        with db.connection_context():
            return returns.request_return(store, "L1", "surge", "bad_phone", buyer_id=buyer_id, now=now)

    done = ret("s2")
    assert done.record["status"] == "sold"
    assert [(s["buyer_id"], s["status"]) for s in done.record["sales"]] == [
        ("s1", "sold"),
        ("s2", "returned"),
        ("s3", "sold"),
    ]
    books = _books(api)
    assert [(s[0], s[3], s[4]) for s in books["sales"]] == [
        ("s1", "sold", "held"),
        ("s2", "returned", "cancelled"),
        ("s3", "sold", "held"),
    ]
    assert books["money"] == ("0.00", "2.00")  # s2's held payout cancelled, the others held still
    assert books["wallets"] == {"acct-s2": 0}  # its debit given back
    assert books["leads"] == [("L1", "sold", "s1")]
    assert _row(books["report"], "s2")["returned"] == 1 and _row(books["report"], "s1")["returned"] == 0
    returned = [(subject, d["buyer_id"]) for kind, subject, d in books["events"] if kind == "lead.returned"]
    assert [b for _, b in returned] == ["s2"]

    ret("s1")
    assert _books(api)["leads"] == [("L1", "sold", "s1")]  # s3's sale stands
    last = ret("s3")
    assert last.record["status"] == "returned"
    assert [s["status"] for s in last.record["sales"]] == ["returned"] * 3
    books = _books(api)
    assert books["leads"] == [("L1", "returned", "s1")] and books["money"] == ("0.00", "0.00")
    assert [d["buyer_id"] for kind, _, d in books["events"] if kind == "lead.returned"] == ["s2", "s1", "s3"]


def test_a_shared_lead_s_later_sale_counts_for_its_buyer_queued_and_settled(api, app, shared):
    """Counter rebuilds read a buyer's sales from the settlement queue and the ledger
    (caps/sales.py): a shared lead's second and third sales are their buyers' as its first is
    s1's, and a returned sale no longer takes a slot."""
    item = _item()
    pending = [json.loads(item.to_json())]
    since = NOW - timedelta(hours=1)
    for b in PRICES:
        queued = sales.queued_sales(None, b, since, pending)
        assert list(queued) == [("surge", "L1")] and queued["surge", "L1"].lease_id == f"lease-L1-{b}"
        assert queued["surge", "L1"].cents == int(Decimal(PRICES[b]) * 100)
    assert sales.queued_sales(None, "ex", since, pending) == {}
    _settle(item)
    with db.connection_context():
        assert [(r[0], r[1], r[4]) for r in sales.sold_since("s3", since)] == [("surge", "L1", "lease-L1-s3")]
        assert sales.settled_of([("surge", "L1")], "s2") == {("surge", "L1")}
        assert sales.settled_of([("surge", "L1")], "ex") == set()
        returns.request_return(services.of(app).store, "L1", "surge", None, buyer_id="s3", now=NOW)
        assert sales.sold_since("s3", since) == [] and len(sales.sold_since("s2", since)) == 1
        assert sales.settled_of([("surge", "L1")], "s3") == {("surge", "L1")}  # returned since: still its sale
