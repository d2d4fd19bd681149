"""Publisher payouts (docs/api.md "Publishers: limits, quality, test mode and payouts" `payout`):
a percentage of the sale price (what `commission_pct` is, still accepted) or a fixed amount
per sold lead; each sale keeps what it paid, a later change applies to later sales only, and a
return takes back exactly that sale's payout. Balances checked in the ledger after real sales
to a real buyer and real returns."""

from __future__ import annotations

import pytest

from webhooks.storage.records.db import db
from webhooks.storage.records.models import Publisher


def balance(publisher_id: str) -> str:
    with db.connection_context():
        return f"{Publisher.get_by_id(publisher_id).balance:.2f}"


def give_back(api, lead_id: str) -> None:
    resp = api.http.post(
        f"{api.base}/v1/admin/leads/{lead_id}/return?publisher_id=surge", json={"reason": "bad"}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text


def sell(api, key: str, lead_id: str) -> dict:
    assert api.post_lead(key, {"lead_id": lead_id}).json()["status"] == "sold"
    return api.wait_settled(lead_id, "surge")


def test_a_fixed_payout_is_earned_per_sale_and_taken_back_by_a_return(api, buyer_server, worker):
    buyer_server.add("acme")
    key = api.put_publisher("surge", payout={"type": "fixed", "amount": "3.00"})
    shown = api.get("/v1/admin/publishers/surge").json()
    assert shown["payout"] == {"type": "fixed", "amount": "3.00"}
    api.put_buyer("acme", buyer_server.url("acme"), price="12.50")
    api.settle_config()
    assert sell(api, key, "p-1")["commission"] == "3.00"
    assert sell(api, key, "p-2")["commission"] == "3.00"
    assert balance("surge") == "6.00"
    give_back(api, "p-1")
    assert balance("surge") == "3.00"


def test_a_change_of_rule_applies_to_later_sales_and_a_return_takes_back_what_its_sale_paid(api, buyer_server, worker):
    buyer_server.add("acme")
    key = api.put_publisher("surge", payout={"type": "percent", "pct": "10"})
    assert api.get("/v1/admin/publishers/surge").json()["payout"] == {"type": "percent", "pct": "10.00"}
    api.put_buyer("acme", buyer_server.url("acme"), price="12.50")
    api.settle_config()
    assert sell(api, key, "c-1")["commission"] == "1.25"
    api.put_publisher("surge", payout={"type": "fixed", "amount": "4.00"})
    api.settle_config()
    assert sell(api, key, "c-2")["commission"] == "4.00"
    assert balance("surge") == "5.25"
    give_back(api, "c-1")  # the 10 % sale: 1.25 back, not today's 4.00
    assert balance("surge") == "4.00"
    api.put_publisher("surge", commission_pct="20")  # commission_pct is still the percent payout
    api.settle_config()
    assert api.get("/v1/admin/publishers/surge").json()["payout"] == {"type": "percent", "pct": "20.00"}
    assert sell(api, key, "c-3")["commission"] == "2.50"


@pytest.mark.parametrize(
    "payout, field",
    [
        ({"type": "flat", "amount": "1.00"}, "payout.type"),
        ("3.00", "payout.type"),
        ({"type": "fixed"}, "payout.amount"),
        ({"type": "fixed", "amount": "-1"}, "payout.amount"),
        ({"type": "fixed", "amount": "1.005"}, "payout.amount"),
        ({"type": "percent", "pct": "101"}, "payout.pct"),
        ({"type": "percent", "pct": "10", "amount": "1"}, "payout.amount"),
    ],
)
def test_a_payout_that_cannot_be_paid_is_refused(api, payout, field):
    resp = api.http.put(
        f"{api.base}/v1/admin/publishers/surge",
        json={"name": "Surge", "api_key": "pk_test_surge_0123456789", "payout": payout},
        headers=api.admin,
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_publisher"
    assert resp.json()["error"]["message"].startswith(field)


def test_a_fetched_publisher_put_back_keeps_its_payout_and_a_disagreeing_one_is_refused(api):
    api.put_publisher("surge", payout={"type": "fixed", "amount": "2.00"})
    fetched = {**api.get("/v1/admin/publishers/surge").json(), "api_key": "pk_test_surge_0123456789"}
    resp = api.http.put(f"{api.base}/v1/admin/publishers/surge", json=fetched, headers=api.admin)
    assert resp.status_code == 200 and resp.json()["payout"] == {"type": "fixed", "amount": "2.00"}
    disagree = {**fetched, "commission_pct": "20", "payout": {"type": "percent", "pct": "10"}}
    resp = api.http.put(f"{api.base}/v1/admin/publishers/surge", json=disagree, headers=api.admin)
    assert resp.status_code == 400 and resp.json()["error"]["message"].startswith("payout")
