"""/ops shows each billed buyer's balance (docs/operations.md "/ops"), against the real Redis
and database: the figures of GET /v1/admin/buyers/<id>, "rebuilding" while Redis does not know
the balance, "not billed" otherwise, and every admin-given text escaped."""

from __future__ import annotations

from datetime import datetime, timezone
from html.parser import HTMLParser

from webhooks import services
from webhooks.billing import balance, charges
from webhooks.billing.balance import Billing
from webhooks.billing.wallets import Entry
from webhooks.caps import leases
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Buyer

HOSTILE = "<script>alert(1)</script>"
FIGURES = ("currency", "available", "wallet", "reserved")
PREPAID = {"mode": "prepaid", "account": HOSTILE, "currency": "USD"}
CREDIT = {"mode": "credit", "account": "buyer-credit", "currency": "USD", "credit_limit": "100.00"}
TTL = {"lease_ttl_ms": 60_000, "probe_ttl_ms": 60_000}
LOST = {"mode": "prepaid", "account": "buyer-lost", "currency": "JPY"}


class Billings(HTMLParser):
    """Each buyer's billing block: its attributes and its text, by buyer id."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, dict[str, str | None]] = {}
        self.text: dict[str, str] = {}
        self._open: str | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if self._open is None and found.get("data-billing"):
            self._open, self._depth = str(found["data-billing"]), 0
            self.attrs[self._open], self.text[self._open] = found, ""
        if self._open is not None and tag == "div":
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if self._open is not None and tag == "div":
            self._depth -= 1
            if self._depth == 0:
                self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.text[self._open] += data


def _fund(store, buyer_id: str, minor: int) -> Billing:
    """A move of the buyer's wallet committed to the ledger, then Redis told (as a payment does)."""
    with db.connection_context():
        billing = Billing.from_json(Buyer.get_by_id(buyer_id).billing)
        assert billing is not None
        with db.atomic():
            kind = Entry.TOP_UP if minor > 0 else Entry.SALE
            charges.move(
                billing.account, billing.currency, minor, datetime.now(timezone.utc), entry=kind, reference="t"
            )
    balance.sync(store, buyer_id, billing)
    return billing


def _page(api) -> Billings:
    resp = api.get("/ops")
    assert resp.status_code == 200, resp.text
    parsed = Billings()
    parsed.feed(resp.text)
    return parsed


def test_ops_shows_each_billed_buyers_balance_as_the_admin_api_does(api, buyer_server):
    store = services.of(api.app).store
    api.put_buyer("acme", buyer_server.url("acme"), name=HOSTILE, price="12.50", billing=PREPAID)
    api.put_buyer("owing", buyer_server.url("owing"), billing=CREDIT)
    api.put_buyer("lost", buyer_server.url("lost"), price="10.00", billing=LOST)
    api.put_buyer("plain", buyer_server.url("plain"))
    billing = _fund(store, "acme", 5000)
    _fund(store, "owing", -3000)  # a sale's debit: a credit buyer may go below zero
    _fund(store, "lost", 700)
    with db.connection_context():
        row = Buyer.get_by_id("acme")
    held = leases.reserve(
        store,
        BuyerRule.from_row(row),
        datetime.now(timezone.utc),
        lease_ttl_ms=60_000,
        probe_ttl_ms=60_000,
        hold=billing.hold(1250),
    )
    assert held.status == "ok"
    store.redis.delete(store.balance_key("lost", "buyer-lost|JPY"))  # Redis lost it: the rebuild has not set it again

    page = _page(api)
    figures = {
        buyer_id: {
            k: page.attrs[buyer_id].get(f"data-{k}") for k in ("mode", "currency", "available", "wallet", "reserved")
        }
        for buyer_id in ("acme", "owing", "lost")
    }
    assert figures == {
        "acme": {"mode": "prepaid", "currency": "USD", "available": "37.50", "wallet": "50.00", "reserved": "12.50"},
        "owing": {"mode": "credit", "currency": "USD", "available": "70.00", "wallet": "-30.00", "reserved": "0.00"},
        "lost": {"mode": "prepaid", "currency": "JPY", "available": "", "wallet": "700", "reserved": ""},
    }
    for buyer_id in ("acme", "owing", "lost"):  # the same figures as the admin API's
        shown = api.get(f"/v1/admin/buyers/{buyer_id}").json()["balance"]
        assert {k: shown[k] or "" for k in FIGURES} == {k: figures[buyer_id][k] for k in FIGURES}
    assert page.attrs["owing"]["data-credit-limit"] == "100.00" and "credit limit 100.00" in page.text["owing"]
    assert "data-credit-limit" not in page.attrs["acme"]
    assert "rebuilding" in page.text["lost"] and "rebuilding" not in page.text["acme"]
    assert page.attrs["plain"]["data-mode"] == "" and page.text["plain"].strip() == "not billed"
    assert HOSTILE in page.text["acme"]  # shown as text, parsed back from its escaped form

    raw = api.get("/ops").text
    assert HOSTILE not in raw and "&lt;script&gt;alert(1)&lt;/script&gt;" in raw


def test_shown_many_reads_what_shown_reads(api, buyer_server):
    """The page's batch read (one wallet query, one Redis round trip) against `shown`, one buyer
    at a time, with two buyers on one wallet and one whose Redis balance is gone."""
    store = services.of(api.app).store
    api.put_buyer("acme", buyer_server.url("acme"), billing=PREPAID)
    api.put_buyer("twin", buyer_server.url("twin"), billing=PREPAID)
    api.put_buyer("owing", buyer_server.url("owing"), billing=CREDIT)
    api.put_buyer("lost", buyer_server.url("lost"), billing=LOST)
    _fund(store, "acme", 1234)
    _fund(store, "owing", -99)
    store.redis.delete(store.balance_key("lost", "buyer-lost|JPY"))
    with db.connection_context():
        billed = [(i, Billing.from_json(Buyer.get_by_id(i).billing)) for i in ("acme", "twin", "owing", "lost")]
        many = balance.shown_many(store, [(i, b) for i, b in billed if b is not None])
        one = {i: balance.shown(store, i, b) for i, b in billed if b is not None}
    assert many == one
    assert many["twin"]["wallet"] == "12.34" and many["lost"]["available"] is None
    assert balance.shown_many(store, []) == {}
