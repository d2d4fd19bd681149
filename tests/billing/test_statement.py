"""A billed buyer's monthly statement (docs/api.md "Buyer balances", docs/buyers.md
"Statements"): its figures, lines, month boundaries and CSV, read from the wallets' journal;
and the journal's invariant, that a wallet's rows add up to its balance after every kind of
move. The app in this process, the real Redis and database; top-ups, refunds and disputes
through the payment webhook, sales and returns through billing.charges.move."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone
from decimal import Decimal

import peewee as pw
import pytest

from testkit.payments import deliver, encode, payload, refund_payload, until_answered, with_metadata
from tests.payments.test_disputes import stripe_dispute
from webhooks.billing import charges, statement, wallets
from webhooks.billing.wallets import Entry
from webhooks.formats import money
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Buyer, Wallet, WalletEntry

ACCOUNT = "buyer-acme"
SALE, RETURN, TOP_UP, REFUND, DISPUTE, CARRIED = (
    Entry.SALE,
    Entry.RETURN,
    Entry.TOP_UP,
    Entry.REFUND,
    Entry.DISPUTE,
    Entry.CARRIED,
)


def at(text: str) -> datetime:
    """A naive UTC time, as the journal holds it."""
    return datetime.fromisoformat(text)


def billed(api, buyer_server, buyer_id: str = "acme", account: str = ACCOUNT, currency: str = "USD") -> None:
    api.put_buyer(buyer_id, buyer_server.url(buyer_id))
    billing = {"mode": "prepaid", "account": account, "currency": currency, "low_balance": None}
    with db.connection_context():
        Buyer.update(billing=json.dumps(billing), billing_account=f"{account}|{currency}").where(
            Buyer.id == buyer_id
        ).execute()


def move(when: str, kind: Entry, minor: int, reference: str, account: str = ACCOUNT, currency: str = "USD") -> None:
    """A wallet move at `when`: a sale or a return as the settlement and the return make it; a
    carried balance as sql/016 writes it (the journal's row only: the wallet had it already)."""
    with db.atomic():
        if kind == CARRIED:
            wallets.write(account, currency, kind=kind, amount_minor=minor, reference=reference, at=at(when))
        else:
            charges.move(account, currency, minor, at(when), entry=kind, reference=reference)


def entries_sum(account: str, currency: str, before: datetime | None = None) -> int:
    """The wallet's rows added up (before `before`), independently of the statement's code."""
    with db.connection_context():
        query = WalletEntry.select(pw.fn.COALESCE(pw.fn.SUM(WalletEntry.amount_minor), 0)).where(
            WalletEntry.customer == account, WalletEntry.currency == currency
        )
        if before is not None:
            query = query.where(WalletEntry.at < before)
        return int(query.scalar())


def get_statement(api, month: str, buyer_id: str = "acme", **params) -> dict:
    resp = api.get(f"/v1/admin/buyers/{buyer_id}/statement", params={"month": month, **params})
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"] == "application/json"
    return resp.json()


def adds_up(s: dict) -> bool:
    figures = {k: Decimal(s[k]) for k in ("opening", "top_ups", "spend", "returns", "reversals")}
    lines_total = sum((Decimal(line["amount"]) for line in s["lines"]), Decimal(0))
    closing = Decimal(s["closing"])
    expected = figures["opening"] + figures["top_ups"] - figures["spend"] + figures["returns"] - figures["reversals"]
    return closing == expected == figures["opening"] + lines_total


NOVEMBER = [  # 2025-11, with rows on both sides of both of its boundaries
    ("2025-10-15T08:00:00", CARRIED, 5000, "sql/016"),
    ("2025-10-31T23:59:59.999999", SALE, -1000, "lead:surge:o1"),
    ("2025-11-01T00:00:00", CARRIED, 2000, "sql/016"),
    ("2025-11-03T10:00:00", TOP_UP, 10000, "stripe:pi_1"),
    ("2025-11-05T10:00:00", SALE, -1250, "lead:surge:n1"),
    ("2025-11-06T10:00:00", RETURN, 1250, "lead:surge:n1"),
    ("2025-11-07T10:00:00", SALE, -1250, "=HYPERLINK(1)"),
    ("2025-11-10T10:00:00", REFUND, -3000, "stripe:re_1"),
    ("2025-11-11T10:00:00", DISPUTE, -2000, "stripe:dp_1"),
    ("2025-11-12T10:00:00", DISPUTE, 2000, "stripe:dp_1"),
    ("2025-11-13T10:00:00", REFUND, 500, "stripe:re_1"),
    ("2025-11-30T23:59:59.999999", SALE, -100, "lead:surge:n9"),
    ("2025-12-01T00:00:00", TOP_UP, 99999, "stripe:pi_9"),
]


def test_a_month_statement_sums_its_lines_between_its_utc_boundaries(api, buyer_server):
    billed(api, buyer_server)
    for row in NOVEMBER:
        move(*row)
    move("2025-11-04T00:00:00", TOP_UP, 777, "stripe:other", account="someone-else")  # another wallet
    move("2025-11-04T00:00:00", TOP_UP, 777, "stripe:other-ngn", currency="NGN")  # another currency

    s = get_statement(api, "2025-11")
    figures = {k: s[k] for k in ("buyer_id", "currency", "month", "opening", "top_ups", "spend", "returns")}
    assert figures == {
        "buyer_id": "acme",
        "currency": "USD",
        "month": "2025-11",
        "opening": "40.00",  # 50.00 carried, a 10.00 sale on the month's last microsecond before
        "top_ups": "120.00",  # the 20.00 carried in the month counts as a top-up
        "spend": "26.00",
        "returns": "12.50",
    }
    assert s["reversals"] == "25.00"  # 30.00 refunded − 5.00 refund reversed; the dispute lost and won
    assert s["closing"] == "121.50"
    assert adds_up(s)
    assert entries_sum(ACCOUNT, "USD", before=at("2025-12-01T00:00:00")) == 12150  # closing, from the rows
    assert s["lines"][0] == {
        "at": "2025-11-01T00:00:00.000000Z",
        "kind": "top_up",
        "amount": "20.00",
        "reference": "sql/016",
    }
    assert s["lines"][-1] == {
        "at": "2025-11-30T23:59:59.999999Z",
        "kind": "sale",
        "amount": "-1.00",
        "reference": "lead:surge:n9",
    }
    assert [line["kind"] for line in s["lines"]] == [
        "top_up",
        "top_up",
        "sale",
        "return",
        "sale",
        "refund",
        "dispute",
        "dispute",
        "refund",
        "sale",
    ]

    october, december = get_statement(api, "2025-10"), get_statement(api, "2025-12")
    assert (october["opening"], october["closing"], len(october["lines"])) == ("0.00", "40.00", 2)
    assert (december["opening"], december["top_ups"], december["closing"]) == ("121.50", "999.99", "1121.49")
    assert adds_up(october) and adds_up(december)
    september = get_statement(api, "2025-09")
    assert september["lines"] == [] and september["opening"] == september["closing"] == "0.00"


def test_the_csv_gives_the_lines_with_amounts_as_numbers_and_no_formulas(api, buyer_server):
    billed(api, buyer_server)
    for row in NOVEMBER:
        move(*row)
    resp = api.get("/v1/admin/buyers/acme/statement", params={"month": "2025-11", "format": "csv"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"].startswith("text/csv")
    assert 'filename="statement-acme-2025-11.csv"' in resp.headers["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(resp.text)))
    assert rows[0] == ["at", "kind", "amount", "reference"]
    assert rows[1] == ["2025-11-01T00:00:00.000000Z", "top_up", "20.00", "sql/016"]
    assert rows[3] == ["2025-11-05T10:00:00.000000Z", "sale", "-12.50", "lead:surge:n1"]  # a number, unescaped
    assert rows[5][3] == "'=HYPERLINK(1)"  # a reference that reads as a formula is text
    assert len(rows) == 1 + 10
    json_lines = get_statement(api, "2025-11")["lines"]
    assert [r[:3] for r in rows[1:]] == [[x["at"], x["kind"], x["amount"]] for x in json_lines]


def test_amounts_have_the_currency_own_decimals(api, buyer_server):
    billed(api, buyer_server, "tokyo", account="buyer-tokyo", currency="JPY")
    move("2025-11-02T00:00:00", TOP_UP, 50000, "stripe:pi_jp", "buyer-tokyo", "JPY")
    move("2025-11-03T00:00:00", SALE, -1500, "lead:surge:jp1", "buyer-tokyo", "JPY")
    s = get_statement(api, "2025-11", "tokyo")
    assert (s["currency"], s["top_ups"], s["spend"], s["closing"]) == ("JPY", "50000", "1500", "48500")
    assert s["lines"][1]["amount"] == "-1500"


def test_a_month_of_many_pages_is_read_whole_in_order_and_once(api, buyer_server, monkeypatch):
    """Keyset pages on (at, id): rows sharing a timestamp across a page's end are neither lost
    nor repeated."""
    monkeypatch.setattr(statement, "PAGE", 3)
    billed(api, buyer_server)
    move("2025-11-01T00:00:00", TOP_UP, 100000, "stripe:pi_big")
    for i in range(10):  # 5 timestamps, two rows each
        move(f"2025-11-02T00:00:0{i // 2}", SALE, -(100 + i), f"lead:surge:p{i}")
    s = get_statement(api, "2025-11")
    assert [line["reference"] for line in s["lines"]] == ["stripe:pi_big"] + [f"lead:surge:p{i}" for i in range(10)]
    assert s["spend"] == "10.45" and adds_up(s)
    rows = list(csv.reader(io.StringIO(api.get("/v1/admin/buyers/acme/statement?month=2025-11&format=csv").text)))
    assert [r[3] for r in rows[1:]] == [line["reference"] for line in s["lines"]]


def test_errors_are_json_like_the_rest_of_the_admin_api(api, buyer_server):
    api.put_buyer("plain", buyer_server.url("plain"))  # not billed
    billed(api, buyer_server)
    year = datetime.now(timezone.utc).year

    def error(path: str, **params) -> tuple[int, str]:
        resp = api.get(path, params=params)
        assert resp.headers["Content-Type"] == "application/json"
        return resp.status_code, resp.json()["error"]["code"]

    assert error("/v1/admin/buyers/nobody/statement", month="2025-11") == (404, "not_found")
    assert error("/v1/admin/buyers/plain/statement", month="2025-11") == (409, "not_billed")
    for bad in ("", "2025-13", "2025-00", "2025-1", "25-11", "1999-12", f"{year + 2}-01", "2025-11\n", "２０２５-11"):
        assert error("/v1/admin/buyers/acme/statement", month=bad) == (400, "invalid_query"), bad
    assert error("/v1/admin/buyers/acme/statement") == (400, "invalid_query")  # no month
    assert error("/v1/admin/buyers/acme/statement", month="2025-11", format="xml") == (400, "invalid_query")
    assert get_statement(api, "2000-01")["lines"] == []
    assert get_statement(api, f"{year + 1}-12")["closing"] == "0.00"
    assert api.http.delete(f"{api.base}/v1/admin/buyers/acme", headers=api.admin).status_code == 204
    assert error("/v1/admin/buyers/acme/statement", month="2025-11") == (404, "not_found")


def _stripe(api, body: dict) -> dict:
    resp = until_answered(api, "stripe", encode(body))
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_the_journal_adds_up_to_the_wallet_after_every_kind_of_move(api, buyer_server, reconfigure):
    reconfigure(payment_account_field="account_id")
    billed(api, buyer_server)
    top_up = with_metadata("stripe", payload("stripe", "pi_1", 10000, "USD"), {"account_id": ACCOUNT})
    assert _stripe(api, top_up) == {"status": "credited"}
    assert _stripe(api, refund_payload("stripe", "re_1", "pi_1", 3000, "USD")) == {"status": "debited"}
    disputed = with_metadata("stripe", payload("stripe", "pi_1Dsp", 2000, "USD"), {"account_id": ACCOUNT})
    assert _stripe(api, disputed) == {"status": "credited"}
    lost = stripe_dispute("charge.dispute.funds_withdrawn")
    assert deliver(api, "stripe", lost).json() == {"status": "debited"}
    won = stripe_dispute("charge.dispute.funds_reinstated", "won")
    assert deliver(api, "stripe", won).json() == {"status": "credited"}
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    with db.atomic():
        charges.move(ACCOUNT, "USD", -1250, now, entry=SALE, reference="lead:surge:s1")
    with db.atomic():
        charges.move(ACCOUNT, "USD", 1250, now, entry=RETURN, reference="lead:surge:s1")

    with db.connection_context():
        wallet = Wallet.get(Wallet.customer == ACCOUNT, Wallet.currency == "USD").balance_minor
        kinds = sorted(e.kind for e in WalletEntry.select().where(WalletEntry.customer == ACCOUNT))
    assert wallet == 10000 - 3000 + 2000 - 2000 + 2000 - 1250 + 1250 == entries_sum(ACCOUNT, "USD")
    assert kinds == sorted(["top_up", "refund", "top_up", "dispute", "dispute", "sale", "return"])

    month = now.strftime("%Y-%m")
    s = get_statement(api, month)
    assert (s["opening"], s["top_ups"], s["spend"], s["returns"]) == ("0.00", "120.00", "12.50", "12.50")
    assert s["reversals"] == "30.00"  # the refund; the dispute lost and won is nought
    assert s["closing"] == "90.00" == money.text(wallet, "USD") and adds_up(s)


@pytest.mark.parametrize("minor, currency, shown", [(0, "USD", "0.00"), (-5, "USD", "-0.05"), (1234, "KWD", "1.234")])
def test_amount_text(minor, currency, shown):
    assert money.text(minor, currency) == shown
