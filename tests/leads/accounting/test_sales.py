"""A lead's sales as records of their own, and buyers' return policies (docs/api.md "Sales: one
lead to several buyers, return policies, payout holds", "Lead returns"), against the real
Redis, database, RQ worker and HTTP buyers."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from testkit.servers import wait_until
from webhooks import services
from webhooks.caps import leases
from webhooks.errors import Conflict
from webhooks.leads.accounting import ledger, returns
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Event, LeadReturn, Publisher, Sale, Wallet

ACCOUNT = "buyer-acme"
CREDIT = {"mode": "credit", "account": ACCOUNT, "currency": "NGN", "credit_limit": "500.00"}


def _item(lead_id: str, sold_at: datetime, buyer_id: str = "acme", price: str = "20.00"):
    out = Outcome(
        status="sold",
        buyer_id=buyer_id,
        price=Decimal(price),
        sold_at=sold_at,
        lease=leases.Lease(buyer_id, f"lease-{lead_id}", ()),
    )
    pub = PublisherRule(id="surge", active=True, payout_pct=Decimal("10"))
    return settlement.make_item(
        publisher=pub, lead_id=lead_id, outcome=out, payload="{}", received_at=sold_at, request_id=None
    )


def _sales(lead_id: str) -> list[Sale]:
    with db.connection_context():
        return list(Sale.select().where(Sale.publisher_id == "surge", Sale.lead_id == lead_id))


def _balance() -> Decimal:
    with db.connection_context():
        return Publisher.get_by_id("surge").balance


def _buyer(api, buyer_server, **fields) -> str:
    buyer_server.add("acme")
    key = api.put_publisher("surge", commission_pct="10")
    api.put_buyer("acme", buyer_server.url("acme"), price="20.00", **fields)
    api.settle_config()
    return key


def _settled(*items) -> None:
    with db.connection_context():
        ledger.settle(items)


def _return(api, lead_id: str, **body):
    return api.http.post(f"{api.base}/v1/admin/leads/{lead_id}/return?publisher_id=surge", json=body, headers=api.admin)


def test_settling_a_lead_twice_writes_its_sale_once(api, buyer_server):
    _buyer(api, buyer_server)
    now = datetime.now(timezone.utc)
    one, two = _item("twice-1", now), _item("twice-2", now)
    with db.connection_context():
        assert ledger.settle([one]) == 1
        assert ledger.settle([one]) == 0  # the job run again
        assert ledger.settle([one, two]) == 1  # a batch with one settled before: lead by lead
    [sale] = _sales("twice-1")
    assert (sale.buyer_id, f"{sale.price:.2f}", f"{sale.payout:.2f}", sale.status) == ("acme", "20.00", "2.00", "sold")
    assert sale.lease_id == "lease-twice-1" and sale.sold_at == now.replace(tzinfo=None)
    assert len(_sales("twice-2")) == 1
    assert _balance() == Decimal("4.00")  # each payout once
    record = api.get("/v1/admin/leads/twice-1?publisher_id=surge").json()
    assert record["sales"] == [
        {
            "buyer_id": "acme",
            "price": "20.00",
            "payout": "2.00",
            "status": "sold",
            "returned_at": None,
            "return_reason": None,
            "feedback": [],
        }
    ]
    assert record["buyer_id"] == "acme" and record["commission"] == "2.00"  # an exclusive lead reads as before


def test_a_routed_lead_has_its_sale_and_an_unsold_one_none(api, buyer_server, worker):
    key = _buyer(api, buyer_server)
    assert api.post_lead(key, {"lead_id": "routed"}).json()["status"] == "sold"
    assert api.wait_settled("routed", "surge")["sales"][0]["buyer_id"] == "acme"
    buyer_server.add("acme", "reject")
    assert api.post_lead(key, {"lead_id": "refused"}).json()["status"] == "unsold"
    assert api.wait_settled("refused", "surge")["sales"] == []
    buyer_server.add("acme")


def test_the_window_ends_on_its_last_microsecond(api, app, buyer_server):
    _buyer(api, buyer_server, returns={"window_days": 2})
    sold_at = datetime.now(timezone.utc) - timedelta(hours=1)
    _settled(_item("w1", sold_at), _item("w2", sold_at))
    store = services.of(app).store
    edge = sold_at + timedelta(days=2)
    with db.connection_context():
        with pytest.raises(Conflict) as closed:
            returns.request_return(store, "w1", "surge", None, now=edge + timedelta(microseconds=1))
        assert closed.value.code == "return_window_closed"
        done = returns.request_return(store, "w2", "surge", None, now=edge)
    assert not done.pending and done.record["status"] == "returned" and done.record["return_id"]


def test_a_reason_the_policy_does_not_list_is_refused(api, buyer_server, worker):
    _buyer(api, buyer_server, returns={"reasons": ["bad_phone", "duplicate"]})
    _settled(_item("r1", datetime.now(timezone.utc)))
    for body in ({"reason": "not_interested"}, {}, {"reason": "Bad_Phone"}):
        resp = _return(api, "r1", **body)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_return", resp.text
        assert "reason" in resp.json()["error"]["message"]
    resp = _return(api, "r1", reason="bad_phone")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "returned" and body["return_reason"] == "bad_phone"
    assert body["sales"][0]["status"] == "returned" and body["sales"][0]["return_id"] == body["return_id"]


def test_max_pct_counts_the_returns_and_sales_of_the_period_only(api, buyer_server, worker):
    """20 % over the last 14 days: 10 sales of those days allow 2 returns made in them (one of an
    older sale too) and refuse the 3rd; 5 older sales (returnable: the window is 30 days) do
    not count as sales of the period, and a return older than it does not count either."""
    _buyer(api, buyer_server, returns={"window_days": 30, "max_pct": 20, "period_days": 14})
    now = datetime.now(timezone.utc)
    _settled(*[_item(f"new{i}", now - timedelta(hours=1)) for i in range(10)])
    _settled(*[_item(f"old{i}", now - timedelta(days=15)) for i in range(5)])
    with db.connection_context():  # returned 15 days ago: out of the period
        Sale.update(status="returned", returned_at=(now - timedelta(days=15)).replace(tzinfo=None)).where(
            Sale.lead_id == "old4"
        ).execute()
    assert _return(api, "new0").status_code == 200
    assert _return(api, "old0").status_code == 200  # at the limit: 2 of 10
    resp = _return(api, "new1")  # one past it: 3 of 10
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "return_limit", resp.text
    assert _sales("new1")[0].status == "sold"


def test_a_pending_return_counts_toward_the_limit_and_a_rejection_frees_it(api, buyer_server, worker):
    _buyer(api, buyer_server, returns={"max_pct": 50, "review": "manual"})
    now = datetime.now(timezone.utc)
    _settled(_item("p1", now), _item("p2", now))
    resp = _return(api, "p1", reason="bad phone")
    assert resp.status_code == 202, resp.text
    pending = resp.json()
    assert pending["status"] == "return_pending" and pending["return_id"].startswith("ret_")
    record = api.get("/v1/admin/leads/p1?publisher_id=surge").json()
    assert record["status"] == "sold"
    assert record["sales"][0]["status"] == "return_pending" and record["sales"][0]["return_id"] == pending["return_id"]
    assert _balance() == Decimal("4.00")  # nothing moved yet
    resp = _return(api, "p2")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "return_limit"
    resp = _return(api, "p1")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "already_returned"

    rejected = api.http.post(f"{api.base}/v1/admin/returns/{pending['return_id']}/reject", headers=api.admin)
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    assert _sales("p1")[0].status == "sold" and _balance() == Decimal("4.00")
    again = api.http.post(f"{api.base}/v1/admin/returns/{pending['return_id']}/approve", headers=api.admin)
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_pending"
    resp = _return(api, "p2")
    assert resp.status_code == 202  # the rejected one no longer counts
    approved = api.http.post(f"{api.base}/v1/admin/returns/{resp.json()['return_id']}/approve", headers=api.admin)
    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    record = api.get("/v1/admin/leads/p2?publisher_id=surge").json()
    assert record["status"] == "returned" and record["sales"][0]["status"] == "returned"
    assert _balance() == Decimal("2.00")
    with db.connection_context():
        types = [e.type for e in Event.select().where(Event.entity.in_(["surge:p1", "surge:p2"])).order_by(Event.id)]
    assert types.count("return.requested") == 2 and types.count("return.rejected") == 1
    assert types.count("lead.returned") == 1
    missing = api.http.post(f"{api.base}/v1/admin/returns/ret_nope/approve", headers=api.admin)
    assert missing.status_code == 404


def test_ten_concurrent_approvals_and_returns_of_one_sale_have_its_effects_once(api, buyer_server, worker):
    key = _buyer(
        api, buyer_server, caps={"daily": 5, "daily_budget": "100.00"}, billing=CREDIT, returns={"review": "manual"}
    )
    assert api.post_lead(key, {"lead_id": "race"}).json()["status"] == "sold"
    api.wait_settled("race", "surge")
    wait_until(
        lambda: api.get("/v1/admin/buyers/acme").json()["balance"]["reserved"] == "0.00", what="the sale settled"
    )
    with db.connection_context():
        assert Wallet.get(Wallet.customer == ACCOUNT).balance_minor == -2000
    assert _balance() == Decimal("2.00")
    resp = _return(api, "race", reason="bad phone")
    assert resp.status_code == 202
    return_id = resp.json()["return_id"]
    start = threading.Barrier(15)

    def act(i: int):
        start.wait()
        s = api.session()
        if i < 10:
            return "approve", s.post(f"{api.base}/v1/admin/returns/{return_id}/approve", headers=api.admin)
        url = f"{api.base}/v1/admin/leads/race/return?publisher_id=surge"
        return "return", s.post(url, json={"reason": "again"}, headers=api.admin)

    with ThreadPoolExecutor(15) as pool:
        answers = list(pool.map(act, range(15)))
    approvals = sorted(r.status_code for kind, r in answers if kind == "approve")
    assert approvals == [200] + [409] * 9
    assert all(
        r.status_code == 409 and r.json()["error"]["code"] == "already_returned" for k, r in answers if k == "return"
    )
    assert _balance() == Decimal("0.00")  # the payout, taken back once
    with db.connection_context():
        assert Wallet.get(Wallet.customer == ACCOUNT).balance_minor == 0  # credited once
        assert Event.select().where(Event.entity == "surge:race", Event.type == "lead.returned").count() == 1
        assert [r.status for r in LeadReturn.select().where(LeadReturn.lead_id == "race")] == ["approved"]
    usage = api.get("/v1/admin/buyers/acme").json()["usage"]
    assert (usage["daily"]["used"], usage["daily_budget"]["used"]) == (0, "0.00")  # the slot, once


@pytest.mark.parametrize(
    "policy, field",
    [
        ({"window_days": -1}, "returns.window_days"),
        ({"max_pct": 101}, "returns.max_pct"),
        ({"max_pct": "20"}, "returns.max_pct"),
        ({"period_days": 0}, "returns.period_days"),
        ({"reasons": []}, "returns.reasons"),
        ({"reasons": ["a", "a"]}, "returns.reasons"),
        ({"reasons": ["bad phone"]}, "returns.reasons"),
        ({"review": "later"}, "returns.review"),
        ({"limit": 3}, "returns.limit"),
        ([], "returns"),
    ],
)
def test_a_bad_return_policy_is_refused_naming_its_field(api, policy, field):
    body = {"name": "B", "endpoint_url": "http://127.0.0.1:9/", "price": "1.00", "returns": policy}
    resp = api.http.put(f"{api.base}/v1/admin/buyers/b", json=body, headers=api.admin)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_buyer"
    assert resp.json()["error"]["message"].startswith(field + ":")


def test_a_return_policy_is_stored_and_return_window_days_still_names_its_window(api):
    base = {"name": "B", "endpoint_url": "http://127.0.0.1:9/", "price": "1.00"}
    defaults = {"window_days": 7, "max_pct": None, "period_days": 14, "reasons": None, "review": "auto"}
    assert api.http.put(f"{api.base}/v1/admin/buyers/b", json=base, headers=api.admin).json()["returns"] == defaults
    old = api.http.put(f"{api.base}/v1/admin/buyers/b", json={**base, "return_window_days": 3}, headers=api.admin)
    assert old.json()["returns"]["window_days"] == 3 and old.json()["return_window_days"] == 3
    policy = {"window_days": 2, "max_pct": 25, "period_days": 30, "reasons": ["bad_phone"], "review": "manual"}
    got = api.http.put(f"{api.base}/v1/admin/buyers/b", json={**base, "returns": policy}, headers=api.admin).json()
    assert got["returns"] == policy and got["return_window_days"] == 2
    patched = api.http.patch(f"{api.base}/v1/admin/buyers/b", json={"return_window_days": 9}, headers=api.admin)
    assert patched.status_code == 200, patched.text
    assert patched.json()["returns"] == {**policy, "window_days": 9}
    patched = api.http.patch(f"{api.base}/v1/admin/buyers/b", json={"returns": {"review": "auto"}}, headers=api.admin)
    assert patched.json()["returns"] == {**policy, "window_days": 9, "review": "auto"}


def test_a_lead_with_several_sales_needs_the_buyer_named(api, app, buyer_server):
    """Routing makes one sale per lead in this release; a second sale written to the ledger as
    the shared-leads routing will write it shows how a return picks its sale."""
    _buyer(api, buyer_server)
    buyer_server.add("zeta")
    api.put_buyer("zeta", buyer_server.url("zeta"), price="15.00", priority=2)
    now = datetime.now(timezone.utc)
    _settled(_item("shared", now))
    with db.connection_context():
        Sale.insert(
            publisher_id="surge",
            lead_id="shared",
            buyer_id="zeta",
            price="15.00",
            payout="1.50",
            status="sold",
            sold_at=now,
        ).execute()
    resp = _return(api, "shared", reason="dup")
    assert resp.status_code == 400 and "buyer_id" in resp.json()["error"]["message"]
    assert _return(api, "shared", buyer_id="nobody").status_code == 404
    resp = _return(api, "shared", buyer_id="zeta", reason="dup")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "sold"  # acme's sale stands
    assert [(s["buyer_id"], s["status"]) for s in body["sales"]] == [("acme", "sold"), ("zeta", "returned")]
    assert _return(api, "shared", buyer_id="acme").json()["status"] == "returned"  # its last sale


def test_concurrent_returns_never_pass_the_limit(api, buyer_server, worker):
    """Ten returns of ten sales at once under 20 %: two are accepted, eight refused; the count
    and the insert are one decision under the buyer's row lock."""
    _buyer(api, buyer_server, returns={"max_pct": 20})
    now = datetime.now(timezone.utc)
    _settled(*[_item(f"c{i}", now) for i in range(10)])
    start = threading.Barrier(10)

    def ret(i: int):
        start.wait()
        url = f"{api.base}/v1/admin/leads/c{i}/return?publisher_id=surge"
        return api.session().post(url, json={}, headers=api.admin)

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(ret, range(10)))
    assert sorted(r.status_code for r in answers) == [200] * 2 + [409] * 8, [r.text for r in answers]
    assert {r.json()["error"]["code"] for r in answers if r.status_code == 409} == {"return_limit"}
    with db.connection_context():
        assert Sale.select().where(Sale.buyer_id == "acme", Sale.status == "returned").count() == 2
