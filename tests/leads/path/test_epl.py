"""Earnings-per-lead routing (docs/api.md "Feedback and earnings-per-lead routing", docs/leads.md
"Earnings-per-lead routing"): the ranking itself (webhooks/leads/rules/earnings.py), and the
whole path against real HTTP buyers, Redis, the RQ worker and the ledger: what settlement and
returns count, and the counts rebuilt from the ledger after Redis lost them."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from testkit.servers import wait_until
from webhooks import services
from webhooks.leads.rules import earnings
from webhooks.leads.rules.earnings import Tally
from webhooks.storage.live import keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, LeadAttempt, Sale

CHEAP = Tally(offers=200, accepted=200, returned=0, earned_cents=200 * 500)  # 5.00, takes every lead
DEAR = Tally(offers=200, accepted=40, returned=0, earned_cents=40 * 1000)  # 10.00, takes one in five


class _Offer:
    def __init__(self, buyer_id: str, price: str, priority: int = 1):
        self.price, self.buyer_id, self.priority = Decimal(price), buyer_id, priority


KEY = lambda o: (o.buyer_id, o.price, o.priority)  # noqa: E731


def _firsts(offers, tallies, draws: int = 2000, seed: int = 7) -> Counter:
    rng = random.Random(seed)
    return Counter(earnings.rank(offers, tallies, rng, key=KEY)[0].buyer_id for _ in range(draws))


def test_a_buyer_paying_less_for_every_lead_goes_before_one_paying_more_for_few():
    """5.00 at 100 % earns 5.00 an offer; 10.00 at 20 % earns 2.00: once each has been offered
    enough, the cheap one is offered first (nearly) always, whatever their list prices say."""
    firsts = _firsts([_Offer("dear", "10.00"), _Offer("cheap", "5.00")], {"cheap": CHEAP, "dear": DEAR})
    assert firsts["cheap"] >= 1990, firsts


def test_a_new_buyer_is_still_offered_leads_to_be_judged():
    """A buyer never offered a lead draws its rates from the whole range: it leads often enough
    to learn them, beside a buyer known to earn well."""
    known = Tally(offers=500, accepted=350, returned=0, earned_cents=350 * 1000)  # 7.00 an offer
    firsts = _firsts([_Offer("known", "10.00"), _Offer("new", "10.00")], {"known": known})
    assert 100 <= firsts["new"] <= 1000, firsts  # a fair share while unknown, not all of them


def test_returns_lower_what_a_buyer_earns():
    """Two buyers alike but for their returns: the one whose sales come back goes second."""
    kept = Tally(offers=300, accepted=300, returned=0, earned_cents=300 * 1000)
    returned = Tally(offers=300, accepted=300, returned=150, earned_cents=150 * 1000)
    firsts = _firsts([_Offer("returns", "10.00"), _Offer("keeps", "10.00")], {"keeps": kept, "returns": returned})
    assert firsts["keeps"] >= 1990, firsts


def test_older_days_weigh_less_by_the_half_life():
    day = {"acme": Tally(offers=8, accepted=4, returned=0, earned_cents=400)}
    assert earnings.weigh([day, day, day], 1.0)["acme"] == Tally(14, 7, 0, 700)  # 1/4 + 1/2 + 1
    assert earnings.weigh([day, day, day], 0)["acme"] == Tally(24, 12, 0, 1200)  # alike
    assert earnings.weigh([day, {}], 0.5)["acme"] == Tally(2, 1, 0, 100)  # a day old: a quarter


def test_the_window_and_a_tally_as_redis_replies_give_them():
    now = datetime(2026, 12, 7, 10, tzinfo=timezone.utc)
    assert earnings.window(now, 3) == ["20261205", "20261206", "20261207"]
    got = earnings.tallies([{b"acme:o": b"3", b"acme:a": b"1", b"acme:e": b"1000"}, {"acme:o": "2", "x:y:r": "1"}])
    assert got == {"acme": Tally(5, 1, 0, 1000), "x:y": Tally(0, 0, 1, 0)}
    assert got["acme"].epl == Decimal("2.00")


@pytest.mark.parametrize("days", [0, 91, "7", True])
def test_a_bad_window_is_refused(api, days):
    body = {"name": "Surge", "api_key": "pk_test_surge_0123456789", "routing": "epl", "epl_window_days": days}
    resp = api.http.put(f"{api.base}/v1/admin/publishers/surge", json=body, headers=api.admin)
    assert resp.status_code == 400 and "epl_window_days" in resp.text, resp.text


def _tallies(app, publisher_id: str = "surge") -> dict[str, Tally]:
    r = services.of(app).store.redis
    now = datetime.now(timezone.utc)
    return earnings.tallies(r.hgetall(keys.earnings(publisher_id, d)) for d in earnings.window(now, 7))


@pytest.fixture
def market(api, app, buyer_server, worker):
    """An epl publisher and two buyers: `dear` at 10.00 saying no to four leads in five,
    `cheap` at 5.00 taking every one (a lower priority: offered second by every fixed mode)."""
    key = api.put_publisher("surge", routing="epl", commission_pct="10")
    cheap = buyer_server.add("cheap")
    dear = buyer_server.add("dear")
    dear.accept_every = 5
    api.put_buyer("dear", buyer_server.url("dear"), priority=1, price="10.00")
    api.put_buyer("cheap", buyer_server.url("cheap"), priority=2, price="5.00")
    api.settle_config()
    return key, cheap, dear


def _ledger_tallies() -> dict[str, Tally]:
    """Each buyer's figures as the ledger holds them: its offers (attempts), yeses, sales."""
    with db.connection_context():
        out: dict[str, Tally] = {}
        for a in LeadAttempt.select():
            out[a.buyer_id] = out.get(a.buyer_id, Tally()) + Tally(1, int(a.outcome == "accepted"), 0, 0)
        for s in Sale.select():
            out[s.buyer_id] = out.get(s.buyer_id, Tally()) + Tally(0, 0, 0, int(s.price * 100))
        return out


def test_routing_learns_to_offer_the_buyer_that_earns_more_first(api, app, market):
    """5.00 at 100 % against 10.00 at 20 %: after 40 leads, each settled (the worker counts
    them), the buyer earning 5.00 an offer leads, not the one listed at 10.00 that earns 2.00;
    every count in Redis is the ledger's."""
    key, _cheap, _dear = market
    for i in range(40):
        assert api.post_lead(key, {"lead_id": f"l{i}"}).json()["status"] == "sold"
    wait_until(lambda: _tallies(app) == _ledger_tallies() and len(_ledger_tallies()) == 2, what="40 leads counted")
    firsts = Counter()
    for i in range(40, 60):
        body = api.post_lead(key, {"lead_id": f"l{i}"}).json()
        firsts[body["attempts"][0]["buyer_id"]] += 1
    assert firsts["cheap"] >= 15, firsts
    wait_until(
        lambda: (
            sum(t.offers for t in _tallies(app).values()) == sum(t.offers for t in _ledger_tallies().values())
            and _ledger_count() == 60
        ),
        what="60 leads counted",
    )
    assert _tallies(app) == _ledger_tallies()


def _ledger_count() -> int:
    with db.connection_context():
        return Lead.select().count()


def test_a_return_takes_its_price_out_of_what_its_buyer_earned(api, app, market):
    key, _cheap, _dear = market
    assert api.post_lead(key, {"lead_id": "r1"}).json()["buyer_id"] == "cheap"
    api.wait_settled("r1", "surge")
    wait_until(lambda: _tallies(app).get("cheap", Tally()).earned_cents == 500, what="the sale counted")
    resp = api.http.post(
        f"{api.base}/v1/admin/leads/r1/return?publisher_id=surge", json={"reason": "bad"}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text
    got = _tallies(app)["cheap"]
    assert (got.returned, got.earned_cents, got.epl) == (1, 0, Decimal("0.00"))


def test_counts_lost_with_redis_are_rebuilt_from_the_ledger_and_leads_wait_meanwhile(api, app, market):
    key, _cheap, _dear = market
    for i in range(6):
        assert api.post_lead(key, {"lead_id": f"b{i}"}).json()["status"] == "sold"
    wait_until(lambda: sum(t.accepted for t in _tallies(app).values()) == 6, what="6 sales counted")
    before = _tallies(app)
    r = services.of(app).store.redis
    for name in r.scan_iter(match=keys.PREFIX + "{p:surge}:epl*"):  # this publisher's figures lost
        r.delete(name)
    services.of(app).intake.router.recent.seen.clear()  # this process's last read: older than READ_EVERY_S
    first = api.post_lead(key, {"lead_id": "after-loss"})
    assert first.status_code == 503 and int(first.headers["Retry-After"]) >= 1, first.text
    wait_until(lambda: r.exists(keys.earnings_ready("surge")), what="the earnings rebuilt")
    assert _tallies(app) == before
    assert api.post_lead(key, {"lead_id": "after-loss"}).json()["status"] == "sold"  # the retry
