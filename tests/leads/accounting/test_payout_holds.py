"""Publisher payout holds and statements (docs/api.md "Sales: one lead to several buyers,
return policies, payout holds"; docs/leads.md "Payout holds"), against the real database and
Redis: a sale's payout held for the publisher's `payout_hold_days`, then payable; a return
while held cancels it, one after it is payable is an adjustment in the month of the return;
the statement (JSON and CSV) and the publisher's sums add up to the ledger at every step."""

from __future__ import annotations

import csv
import io
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from webhooks import services
from webhooks.caps import leases
from webhooks.errors import Conflict
from webhooks.leads.accounting import ledger, payouts, returns
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Publisher, Sale
from webhooks.storage.states import SaleStatus

UTC = timezone.utc


def _at(day: str, time: str = "10:00:00") -> datetime:
    return datetime.fromisoformat(f"2026-{day}T{time}").replace(tzinfo=UTC)


def _item(publisher_id: str, lead_id: str, sold_at: datetime, price: str = "20.00"):
    out = Outcome(
        status="sold",
        buyer_id="acme",
        price=Decimal(price),
        sold_at=sold_at,
        lease=leases.Lease("acme", f"lease-{lead_id}", ()),
    )
    pub = PublisherRule(id=publisher_id, active=True, payout_pct=Decimal("10"))
    return settlement.make_item(
        publisher=pub, lead_id=lead_id, outcome=out, payload="{}", received_at=sold_at, request_id=None
    )


def _setup(api, buyer_server, **holds: int) -> None:
    buyer_server.add("acme")
    for publisher_id, days in holds.items():
        api.put_publisher(publisher_id, commission_pct="10", payout_hold_days=days)
    api.put_buyer("acme", buyer_server.url("acme"), price="20.00", returns={"window_days": 60})
    api.settle_config()


def _settle(*items) -> None:
    with db.connection_context():
        ledger.settle(items)


def _release(now: datetime) -> int:
    with db.connection_context():
        return payouts.release(now.replace(tzinfo=None))


def _return(app, publisher_id: str, lead_id: str, now: datetime):
    with db.connection_context():
        return returns.request_return(services.of(app).store, lead_id, publisher_id, "bad_phone", now=now)


def _state(publisher_id: str, lead_id: str) -> tuple[str, str]:
    with db.connection_context():
        sale = Sale.get(Sale.publisher_id == publisher_id, Sale.lead_id == lead_id)
    return sale.status, sale.payout_state


def _statement(api, publisher_id: str, month: str) -> dict:
    resp = api.get(f"/v1/admin/publishers/{publisher_id}/statement?month={month}")
    assert resp.status_code == 200, resp.text
    return resp.json()


def _figures(statement: dict) -> dict[str, Decimal]:
    return {k: Decimal(statement[k]) for k in ("earned", "returned", "held", "payable", "adjustments")}


def _check(api, publisher_id: str, months: tuple[str, ...]) -> dict[str, dict[str, Decimal]]:
    """The invariants of every moment: each statement's lines add up to its figures, its CSV is
    its JSON, its earned is what the ledger's sales of the month paid and its adjustments what
    the ledger's returns of the month took back after payable; over the months the payable
    figures and adjustments are the publisher's balance and the held figures its held sum."""
    by_month = {}
    for month in months:
        st = _statement(api, publisher_id, month)
        figures = _figures(st)
        assert figures["earned"] == figures["returned"] + figures["held"] + figures["payable"], st
        kinds: dict[str, Decimal] = {}
        for line in st["lines"]:
            kinds[line["kind"]] = kinds.get(line["kind"], Decimal(0)) + Decimal(line["amount"])
        for kind in ("returned", "held", "payable"):
            assert kinds.get(kind, Decimal(0)) == figures[kind], (kind, st)
        assert kinds.get("adjustment", Decimal(0)) == figures["adjustments"], st
        assert _csv(api, publisher_id, month) == [
            [line["at"], line["kind"], line["lead_id"], line["buyer_id"], line["amount"], line["payable_at"] or ""]
            for line in st["lines"]
        ]
        start = datetime.fromisoformat(f"{month}-01")
        end = (start + timedelta(days=32)).replace(day=1)
        with db.connection_context():
            mine = Sale.select().where(Sale.publisher_id == publisher_id)
            sold = [s for s in mine if start <= s.sold_at < end]
            returned = [s for s in mine if s.returned_at is not None and start <= s.returned_at < end]
        assert figures["earned"] == sum((Decimal(s.payout) for s in sold), Decimal(0))
        after_payable = [s for s in returned if s.payout_state == "payable"]
        assert figures["adjustments"] == -sum((Decimal(s.payout) for s in after_payable), Decimal(0))
        by_month[month] = figures
    shown = api.get(f"/v1/admin/publishers/{publisher_id}").json()
    assert Decimal(shown["balance"]) == Decimal(shown["payable"])
    assert Decimal(shown["payable"]) == sum((f["payable"] + f["adjustments"] for f in by_month.values()), Decimal(0))
    assert Decimal(shown["held"]) == sum((f["held"] for f in by_month.values()), Decimal(0))
    return by_month


def _csv(api, publisher_id: str, month: str) -> list[list[str]]:
    resp = api.get(f"/v1/admin/publishers/{publisher_id}/statement?month={month}&format=csv")
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(resp.text)))
    assert rows[0] == ["at", "kind", "lead_id", "buyer_id", "amount", "payable_at"]
    return [[*row[:4], f"{Decimal(row[4]):.2f}", row[5]] for row in rows[1:]]


def test_payout_hold_days_is_validated_and_shown(api):
    for bad in (-1, 366, "7", 7.5, True):
        resp = api.http.put(
            f"{api.base}/v1/admin/publishers/p",
            json={"name": "P", "api_key": "pk_test_p_0123456789", "payout_hold_days": bad},
            headers=api.admin,
        )
        assert resp.status_code == 400, bad
        assert resp.json()["error"]["code"] == "invalid_publisher"
        assert "payout_hold_days" in resp.json()["error"]["message"], resp.text
    api.put_publisher("p")
    shown = api.get("/v1/admin/publishers/p").json()
    assert (shown["payout_hold_days"], shown["held"], shown["payable"]) == (0, "0.00", "0.00")
    api.put_publisher("p", payout_hold_days=365)
    resp = api.http.patch(f"{api.base}/v1/admin/publishers/p", json={"name": "Q"}, headers=api.admin)
    assert resp.json()["payout_hold_days"] == 365  # a patch not naming it keeps it
    put_back = {**resp.json(), "api_key": "pk_test_p_0123456789"}
    resp = api.http.put(f"{api.base}/v1/admin/publishers/p", json=put_back, headers=api.admin)
    assert resp.status_code == 200 and resp.json()["payout_hold_days"] == 365  # a GET put back
    resp = api.http.patch(f"{api.base}/v1/admin/publishers/p", json={"payout_hold_days": None}, headers=api.admin)
    assert resp.json()["payout_hold_days"] == 0  # cleared: the default


def test_no_hold_is_payable_at_once_and_a_hold_pays_when_it_ends(api, app, buyer_server):
    _setup(api, buyer_server, flat=0, surge=7)
    sold_at = _at("03-10")
    _settle(_item("flat", "f1", sold_at), _item("surge", "s1", sold_at))
    assert _state("flat", "f1") == ("sold", "payable")
    assert _state("surge", "s1") == ("sold", "held")
    assert _check(api, "flat", ("2026-03",))["2026-03"]["payable"] == Decimal("2.00")
    assert _check(api, "surge", ("2026-03",))["2026-03"]["held"] == Decimal("2.00")
    assert _release(sold_at + timedelta(days=7) - timedelta(microseconds=1)) == 0  # not yet
    assert _state("surge", "s1") == ("sold", "held")
    assert _release(sold_at + timedelta(days=7)) == 1
    assert _release(sold_at + timedelta(days=8)) == 0  # once
    assert _state("surge", "s1") == ("sold", "payable")
    figures = _check(api, "surge", ("2026-03",))["2026-03"]
    assert (figures["held"], figures["payable"]) == (Decimal(0), Decimal("2.00"))


def test_a_return_while_held_cancels_and_one_after_is_an_adjustment_of_its_month(api, app, buyer_server):
    """Across the January/February boundary, holds of 0 and 7 days, returns before and after
    the hold ends (one after it ended but before the job came): the statements and the
    publishers' sums after every step, and what each month says at the end."""
    _setup(api, buyer_server, flat=0, surge=7)
    months = ("2026-01", "2026-02")

    def step() -> None:
        _check(api, "surge", months)
        _check(api, "flat", months)

    _settle(_item("flat", "f2", _at("01-15")))
    _return(app, "flat", "f2", _at("01-16"))  # no hold: an adjustment of January
    _settle(_item("surge", "s1", _at("01-20")), _item("surge", "s2", _at("01-27")))
    step()
    assert _release(_at("01-28")) == 1  # s1's hold ended on the 27th
    _settle(_item("surge", "s3", _at("01-29")), _item("flat", "f1", _at("01-31", "12:00:00")))
    _return(app, "surge", "s2", _at("01-30"))  # held: cancelled
    step()
    _settle(
        _item("surge", "s4", _at("01-31", "23:59:59.999999")),
        _item("surge", "s5", _at("02-01", "00:00:00")),
        _item("flat", "f3", _at("02-02")),
    )
    _return(app, "flat", "f1", _at("02-01"))
    _return(app, "surge", "s1", _at("02-02"))  # payable: an adjustment of February
    step()
    _return(app, "surge", "s3", _at("02-05", "11:00:00"))  # its hold ended at 10:00, no job since
    step()
    assert _release(_at("02-06")) == 0
    assert [_state("surge", s)[1] for s in ("s1", "s2", "s3", "s4", "s5")] == [
        "payable",
        "cancelled",
        "payable",
        "held",
        "held",
    ]
    surge = step_figures = _check(api, "surge", months)
    assert surge["2026-01"] == {
        "earned": Decimal("8.00"),
        "returned": Decimal("2.00"),  # s2
        "held": Decimal("2.00"),  # s4, sold on the month's last microsecond
        "payable": Decimal("4.00"),  # s1, s3
        "adjustments": Decimal(0),
    }
    assert step_figures["2026-02"] == {
        "earned": Decimal("2.00"),  # s5
        "returned": Decimal(0),
        "held": Decimal("2.00"),
        "payable": Decimal(0),
        "adjustments": Decimal("-4.00"),  # s1, s3 returned in February
    }
    flat = _check(api, "flat", months)
    assert (flat["2026-01"]["payable"], flat["2026-01"]["adjustments"]) == (Decimal("4.00"), Decimal("-2.00"))
    assert (flat["2026-02"]["payable"], flat["2026-02"]["adjustments"]) == (Decimal("2.00"), Decimal("-2.00"))
    assert _release(_at("02-09")) == 2  # s4, s5
    final = _check(api, "surge", months)
    assert (final["2026-01"]["payable"], final["2026-02"]["payable"]) == (Decimal("6.00"), Decimal("2.00"))
    st = _statement(api, "surge", "2026-02")
    adjustments = [line for line in st["lines"] if line["kind"] == "adjustment"]
    assert [(a["lead_id"], a["amount"], a["at"][:10]) for a in adjustments] == [
        ("s1", "-2.00", "2026-02-02"),
        ("s3", "-2.00", "2026-02-05"),
    ]


@pytest.mark.parametrize("offset_us", [-1, 0])
def test_returns_and_approvals_racing_the_release_have_one_effect(api, app, buyer_server, offset_us):
    """Ten sales whose hold ends now: two releases at the hold's end (two runs of the job, two
    sales a transaction) and returns (five at once, five approvals of manual returns) just
    before it (-1 µs) or at it (0), all at once. Each
    sale is either cancelled (never payable: no adjustment) or payable and adjusted, never both
    or neither, and the publisher's sums and statement say the same."""
    _setup(api, buyer_server, surge=7)
    sold_at = _at("04-01")
    _settle(*(_item("surge", f"r{i}", sold_at) for i in range(10)))
    api.put_buyer("acme", buyer_server.url("acme"), price="20.00", returns={"window_days": 60, "review": "manual"})
    store = services.of(app).store
    pending = []
    with db.connection_context():
        for i in range(5):
            pending.append(returns.request_return(store, f"r{i}", "surge", None, now=sold_at).return_id)
    api.put_buyer("acme", buyer_server.url("acme"), price="20.00", returns={"window_days": 60})
    api.settle_config()
    end = sold_at + timedelta(days=7)
    at = end + timedelta(microseconds=offset_us)
    start = threading.Barrier(12)

    def act(i: int):
        start.wait()
        with db.connection_context():
            if i >= 10:
                return payouts.release(end.replace(tzinfo=None), batch=2)
            if i < 5:
                return returns.decide(store, pending[i], approve=True, now=at)
            return returns.request_return(store, f"r{i}", "surge", None, now=at)

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(act, range(12)))
    states = [_state("surge", f"r{i}") for i in range(10)]
    assert {status for status, _ in states} == {SaleStatus.RETURNED}
    if offset_us == 0:  # returned at the hold's end: payable then, an adjustment whoever went first
        assert {state for _, state in states} == {"payable"}
    figures = _check(api, "surge", ("2026-04",))["2026-04"]
    cancelled = sum(1 for _, state in states if state == "cancelled")
    assert figures["returned"] == Decimal(2 * cancelled)
    assert figures["payable"] == -figures["adjustments"] == Decimal(2 * (10 - cancelled))
    shown = api.get("/v1/admin/publishers/surge").json()
    assert (shown["balance"], shown["held"]) == ("0.00", "0.00")
    with db.connection_context(), pytest.raises(Conflict):
        returns.request_return(store, "r0", "surge", None, now=at)
    assert _release(end + timedelta(days=1)) == 0


def test_the_statement_route_answers_its_errors(api):
    api.put_publisher("p")
    this_month = datetime.now(UTC).strftime("%Y-%m")
    resp = api.get("/v1/admin/publishers/p/statement")
    assert resp.status_code == 200 and resp.json() == {
        "publisher_id": "p",
        "month": this_month,
        "lines": [],
        "earned": "0.00",
        "returned": "0.00",
        "held": "0.00",
        "payable": "0.00",
        "adjustments": "0.00",
    }
    for bad in ("2026-13", "2026-1", "26-01", "2026-01\n", "1999-12"):
        resp = api.get("/v1/admin/publishers/p/statement", params={"month": bad})
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_query", bad
    assert api.get("/v1/admin/publishers/p/statement?format=xml").status_code == 400
    assert api.get("/v1/admin/publishers/nope/statement").status_code == 404
    assert api.get("/v1/admin/publishers/nope/statement?format=csv").status_code == 404


def test_the_csv_is_safe_against_formulas(api, app, buyer_server):
    _setup(api, buyer_server, surge=0)
    _settle(_item("surge", "=HYPERLINK(1)", _at("05-01")))
    text = api.get("/v1/admin/publishers/surge/statement?month=2026-05&format=csv").text
    assert "'=HYPERLINK(1)" in text and "\n=" not in text
    assert text.splitlines()[1].split(",")[4] == "2.00"  # a number, not text


def test_the_migration_leaves_the_sales_before_it_payable(api, buyer_server):
    """A sale written before sql/024 has no hold: payable (its payout is in the balance), and a
    returned one an adjustment of its return's month, as the balance took it back then."""
    _setup(api, buyer_server, surge=7)
    with db.connection_context():
        for lead_id, status, returned_at in (("old1", "sold", None), ("old2", "returned", _at("06-03"))):
            Sale.insert(
                publisher_id="surge",
                lead_id=lead_id,
                buyer_id="acme",
                price="20.00",
                payout="2.00",
                status=status,
                sold_at=_at("06-01").replace(tzinfo=None),
                returned_at=None if returned_at is None else returned_at.replace(tzinfo=None),
            ).execute()
        Publisher.update(balance=Decimal("2.00")).where(Publisher.id == "surge").execute()
    figures = _check(api, "surge", ("2026-06",))["2026-06"]
    assert (figures["payable"], figures["adjustments"]) == (Decimal("4.00"), Decimal("-2.00"))


def test_a_statement_read_a_page_at_a_time_is_the_same(api, app, buyer_server, monkeypatch):
    """Sales and adjustments merged in time order across pages of two lines each."""
    from webhooks.billing import statement

    _setup(api, buyer_server, surge=0)
    _settle(*(_item("surge", f"p{i}", _at("07-01") + timedelta(hours=i)) for i in range(5)))
    for i in (0, 3):
        _return(app, "surge", f"p{i}", _at("07-01") + timedelta(hours=i, minutes=30))
    whole = _statement(api, "surge", "2026-07")
    monkeypatch.setattr(statement, "PAGE", 2)
    assert _statement(api, "surge", "2026-07") == whole
    assert [(line["lead_id"], line["kind"]) for line in whole["lines"]] == [
        ("p0", "payable"),
        ("p0", "adjustment"),
        ("p1", "payable"),
        ("p2", "payable"),
        ("p3", "payable"),
        ("p3", "adjustment"),
        ("p4", "payable"),
    ]
    _check(api, "surge", ("2026-07",))


def test_a_routed_sale_is_held_and_the_periodic_job_releases_it(api, buyer_server, worker, monkeypatch, database_down):
    """A lead sold to an HTTP buyer and settled by the worker: its payout held for the
    publisher's 7 days; the scheduled job, with the database down, fails quietly and leaves it
    held; up again, at the hold's end, releases it."""
    from workers import payouts as job
    from workers.schedule import PERIODIC

    assert "workers.payouts.release_payouts" in {d["func"] for d in PERIODIC}
    _setup(api, buyer_server, surge=7)
    key = "pk_test_surge_0123456789"
    assert api.post_lead(key, {"lead_id": "routed"}).json()["status"] == "sold"
    api.wait_settled("routed", "surge")
    shown = api.get("/v1/admin/publishers/surge").json()
    assert (shown["held"], shown["payable"]) == ("2.00", "0.00")
    with db.connection_context():
        sale = Sale.get(Sale.lead_id == "routed")
    end = sale.payable_at.replace(tzinfo=UTC)
    assert end == sale.sold_at.replace(tzinfo=UTC) + timedelta(days=7)
    monkeypatch.setattr(job, "backends", lambda: None)
    with database_down():
        assert job.release_payouts(end) == 0  # no exception for RQ; left for the next run
    assert job.release_payouts(end - timedelta(microseconds=1)) == 0
    assert job.release_payouts(end) == 1
    shown = api.get("/v1/admin/publishers/surge").json()
    assert (shown["held"], shown["payable"]) == ("0.00", "2.00")
