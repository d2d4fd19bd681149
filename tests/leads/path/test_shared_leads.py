"""Shared leads (docs/api.md "Sales: one lead to several buyers, return policies, payout holds"):
a publisher's `sell.max_sales`, a buyer's `contract`, and routing that sells a lead no
exclusive buyer took to up to `max_sales` shared buyers, in waves, against real HTTP buyers,
Redis and database. A routing that died mid-wave is left in Redis by the router's own code
(its leases and attempt note), and the publisher's retry goes to the app in-process."""

from __future__ import annotations

import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from testkit.servers import wait_until
from webhooks import services
from webhooks.caps import leases
from webhooks.leads.accounting import ledger
from webhooks.leads.path import answers, recovery, settlement
from webhooks.leads.path.context import LeadContext
from webhooks.leads.path.routing import Offer, Outcome, Route, Sharing, Sold
from webhooks.leads.rules.catalog import load_snapshot
from webhooks.storage.live import keys, settle_queue
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Sale, Wallet

CREDIT = {"mode": "credit", "account": "acct-s1", "currency": "NGN", "credit_limit": "100.00"}


def _publisher(api, max_sales: int, pid: str = "surge") -> str:
    return api.put_publisher(pid, commission_pct="10", sell={"max_sales": max_sales})


def _shared(api, buyer_server, *names: str, modes: dict | None = None, **fields) -> dict:
    """Shared buyers `names`, priorities 1.. in that order, price 10.00 (or `fields`)."""
    stubs = {}
    for priority, name in enumerate(names, 1):
        stubs[name] = buyer_server.add(name, (modes or {}).get(name, "accept"))
        api.put_buyer(name, buyer_server.url(name), priority=priority, contract="shared", **fields)
    return stubs


def _used(api, buyer_id: str) -> int:
    return api.get(f"/v1/admin/buyers/{buyer_id}").json()["usage"]["daily"]["used"]


def _sold_to(body: dict) -> list[str]:
    return [s["buyer_id"] for s in body.get("sales", [])]


# --- the publisher's sell.max_sales and the buyer's contract ----------------------------------


@pytest.mark.parametrize("n", [1, 2, 10])
def test_max_sales_from_one_to_ten_is_stored_and_shown(api, n):
    _publisher(api, n)
    assert api.get("/v1/admin/publishers/surge").json()["sell"] == {"max_sales": n}


@pytest.mark.parametrize(
    ("sell", "field"),
    [
        ({"max_sales": 0}, "sell.max_sales"),
        ({"max_sales": 11}, "sell.max_sales"),
        ({"max_sales": "3"}, "sell.max_sales"),
        ({"max_sales": 2.5}, "sell.max_sales"),
        ({"max_sales": True}, "sell.max_sales"),
        ({"max_sales": 3, "mode": "shared"}, "sell.mode"),
        (3, "sell"),
        ([3], "sell"),
    ],
)
def test_a_bad_sell_is_refused_naming_its_field(api, sell, field):
    body = {"name": "Surge", "api_key": "pk_test_surge_0123456789", "sell": sell}
    resp = api.http.put(f"{api.base}/v1/admin/publishers/surge", json=body, headers=api.admin)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_publisher"
    assert resp.json()["error"]["message"].startswith(field + ":"), resp.text


def test_a_form_like_put_with_sell_or_contract_null_sets_the_defaults(api):
    for sell in (None, {"max_sales": None}):
        _publisher(api, 4)
        assert api.get("/v1/admin/publishers/surge").json()["sell"] == {"max_sales": 4}
        api.put_publisher("surge", commission_pct="10", sell=sell)
        assert api.get("/v1/admin/publishers/surge").json()["sell"] == {"max_sales": 1}
    api.put_publisher("plain")  # no sell at all: exclusive
    assert api.get("/v1/admin/publishers/plain").json()["sell"] == {"max_sales": 1}

    shown = api.put_buyer("b", "http://127.0.0.1:9/b", contract="shared")
    assert shown["contract"] == "shared" and api.get("/v1/admin/buyers/b").json()["contract"] == "shared"
    assert api.put_buyer("b", "http://127.0.0.1:9/b", contract=None)["contract"] == "exclusive"
    assert api.get("/v1/admin/buyers/b").json()["contract"] == "exclusive"
    assert api.put_buyer("c", "http://127.0.0.1:9/c")["contract"] == "exclusive"


@pytest.mark.parametrize("contract", ["both", "Shared", "", 1, ["shared"]])
def test_a_bad_contract_is_refused_naming_its_field(api, contract):
    body = {"name": "B", "endpoint_url": "http://127.0.0.1:9/b", "price": "1.00", "contract": contract}
    resp = api.http.put(f"{api.base}/v1/admin/buyers/b", json=body, headers=api.admin)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_buyer"
    assert resp.json()["error"]["message"].startswith("contract:"), resp.text


# --- routing ------------------------------------------------------------------------------------


def test_an_exclusive_buyer_that_accepts_buys_the_lead_alone(api, buyer_server):
    key = _publisher(api, 3)
    ex = buyer_server.add("ex")
    api.put_buyer("ex", buyer_server.url("ex"), priority=9, price="30.00")  # after the shared by priority
    stubs = _shared(api, buyer_server, "s1", "s2")
    api.settle_config()
    body = api.post_lead(key, {"lead_id": "L1"}).json()
    assert (body["status"], body["buyer_id"], body["price"]) == ("sold", "ex", "30.00")
    assert body["sales"] == [{"buyer_id": "ex", "price": "30.00"}]
    assert len(ex.received) == 1 and stubs["s1"].received == [] and stubs["s2"].received == []


def test_when_the_exclusive_buyer_says_no_max_sales_shared_buyers_buy_it_in_priority_order(api, buyer_server, worker):
    key = _publisher(api, 3)
    ex = buyer_server.add("ex", "reject")
    api.put_buyer("ex", buyer_server.url("ex"), priority=9)
    stubs = _shared(api, buyer_server, "s1", "s2", "s3", "s4", "s5", caps={"daily": 10})
    api.settle_config()
    body = api.post_lead(key, {"lead_id": "L1", "state": "TX"}).json()
    assert body["status"] == "sold" and (body["buyer_id"], body["price"]) == ("s1", "10.00")
    assert body["sales"] == [{"buyer_id": b, "price": "10.00"} for b in ("s1", "s2", "s3")]
    assert [(a["buyer_id"], a["outcome"]) for a in body["attempts"]] == [
        ("ex", "rejected"),
        ("s1", "accepted"),
        ("s2", "accepted"),
        ("s3", "accepted"),
    ]
    assert len(ex.received) == 1 and stubs["s4"].received == [] and stubs["s5"].received == []
    for name in ("s1", "s2", "s3"):
        [offer] = stubs[name].received
        assert offer["headers"]["Idempotency-Key"] == f"surge:L1:{name}" and offer["body"]["lead"] == {"state": "TX"}
    assert [_used(api, b) for b in ("s1", "s2", "s3", "s4", "s5")] == [1, 1, 1, 0, 0]
    record = api.wait_settled("L1", "surge")
    assert [(s["buyer_id"], s["price"], s["status"]) for s in record["sales"]] == [
        (b, "10.00", "sold") for b in ("s1", "s2", "s3")
    ]
    replay = api.post_lead(key, {"lead_id": "L1", "state": "TX"}).json()
    assert replay["replayed"] is True and _sold_to(replay) == ["s1", "s2", "s3"]
    assert sum(len(s.received) for s in stubs.values()) == 3  # the replay asked nobody


def test_shared_buyers_that_say_no_give_their_slot_back_and_the_next_wave_fills(api, buyer_server, worker):
    """max 3 of six: the first wave (s1 s2 s3) brings one yes (s2), the second (s4 s5) two: s6 is
    never asked."""
    key = _publisher(api, 3)
    modes = {"s1": "reject", "s3": "error500"}
    stubs = _shared(api, buyer_server, "s1", "s2", "s3", "s4", "s5", "s6", modes=modes, caps={"daily": 10})
    api.settle_config()
    body = api.post_lead(key, {"lead_id": "W1"}).json()
    assert body["status"] == "sold" and _sold_to(body) == ["s2", "s4", "s5"]
    outcomes = {a["buyer_id"]: a["outcome"] for a in body["attempts"]}
    assert outcomes == {"s1": "rejected", "s2": "accepted", "s3": "error", "s4": "accepted", "s5": "accepted"}
    assert stubs["s6"].received == []
    assert [len(stubs[b].received) for b in ("s1", "s2", "s3", "s4", "s5")] == [1] * 5
    assert [_used(api, b) for b in ("s1", "s2", "s3", "s4", "s5", "s6")] == [0, 1, 0, 1, 1, 0]
    assert not services.of(api.app).store.redis.exists(keys.lead_attempt("surge", "W1"))
    record = api.wait_settled("W1", "surge")
    assert [s["buyer_id"] for s in record["sales"]] == ["s2", "s4", "s5"]


def test_too_few_willing_shared_buyers_sell_it_to_those_and_none_leaves_it_unsold(api, buyer_server):
    key = _publisher(api, 3)
    stubs = _shared(api, buyer_server, "s1", "s2", "s3", modes={"s1": "reject", "s3": "reject"})
    api.settle_config()
    body = api.post_lead(key, {"lead_id": "F1"}).json()
    assert (body["status"], _sold_to(body)) == ("sold", ["s2"])
    stubs["s2"].mode = "reject"
    body = api.post_lead(key, {"lead_id": "F2"}).json()
    assert body["status"] == "unsold" and body["buyer_id"] is None and "sales" not in body
    assert [len(s.received) for s in stubs.values()] == [2, 2, 2]


def test_a_shared_buyer_with_a_full_cap_is_skipped_and_traced(api, buyer_server, worker):
    key = _publisher(api, 2)
    stubs = _shared(api, buyer_server, "s1", "s2", "s3")
    api.put_buyer("s1", buyer_server.url("s1"), priority=1, contract="shared", caps={"daily": 1})
    api.settle_config()
    assert _sold_to(api.post_lead(key, {"lead_id": "C1"}).json()) == ["s1", "s2"]
    assert _sold_to(api.post_lead(key, {"lead_id": "C2"}).json()) == ["s2", "s3"]
    assert len(stubs["s1"].received) == 1 and _used(api, "s1") == 1
    record = api.wait_settled("C2", "surge")
    assert {"buyer_id": "s1", "reason": "cap_full:daily"} in record["skipped"]


def test_each_shared_buyer_s_dedupe_is_its_own(api, buyer_server, worker):
    """s1 bought this consumer already: skipped as duplicate; s2 (no dedupe) buys again."""
    key = _publisher(api, 2)
    stubs = _shared(api, buyer_server, "s1", "s2", "s3")
    api.put_buyer("s1", buyer_server.url("s1"), priority=1, contract="shared", dedupe={"fields": ["email"], "days": 30})
    api.settle_config()
    first = api.post_lead(key, {"lead_id": "D1", "email": "ada@example.com"}).json()
    assert _sold_to(first) == ["s1", "s2"]
    again = api.post_lead(key, {"lead_id": "D2", "email": "ada@example.com"}).json()
    assert _sold_to(again) == ["s2", "s3"]
    assert len(stubs["s1"].received) == 1
    record = api.wait_settled("D2", "surge")
    assert {"buyer_id": "s1", "reason": "duplicate"} in record["skipped"]
    other = api.post_lead(key, {"lead_id": "D3", "email": "bob@example.com"}).json()
    assert _sold_to(other) == ["s1", "s2"]


def test_a_billed_shared_buyer_s_price_is_held_per_sale_then_debited(api, buyer_server, worker_manager):
    """Two leads sold to s1 (billed) beside s2: each holds 10.00 of s1's balance until settled,
    then the wallet is debited 10.00 a sale and nothing stays held."""
    worker_manager.stop()  # the settlements wait: what is held shows
    key = _publisher(api, 2)
    _shared(api, buyer_server, "s1", "s2")
    api.put_buyer("s1", buyer_server.url("s1"), priority=1, contract="shared", billing=CREDIT)
    api.settle_config()
    for lead_id in ("B1", "B2"):
        assert _sold_to(api.post_lead(key, {"lead_id": lead_id}).json()) == ["s1", "s2"]
    assert api.get("/v1/admin/buyers/s1").json()["balance"]["reserved"] == "20.00"
    svc = services.of(api.app)
    queued = settle_queue.unsettled(svc.queue_redis.redis)
    held = [leases.Lease(*sale["lease"], ()) for item in queued for sale in settle_queue.sales_in(item)]
    assert sorted(lease.buyer_id for lease in held) == ["s1", "s1", "s2", "s2"]
    assert {svc.store.redis.hget(lease.key, "state") for lease in held} == {"confirmed"}  # end_lead: every sale
    worker_manager.ensure()
    for lead_id in ("B1", "B2"):
        api.wait_settled(lead_id, "surge")
    wait_until(
        lambda: api.get("/v1/admin/buyers/s1").json()["balance"]["reserved"] == "0.00", what="s1's holds released"
    )
    with db.connection_context():
        assert Wallet.get(Wallet.customer == "acct-s1").balance_minor == -2000
        charged = Sale.select().where(Sale.buyer_id == "s1").order_by(Sale.lead_id)
        assert [(s.lead_id, s.charge_account, s.charge_minor) for s in charged] == [
            ("B1", "acct-s1|NGN", 1000),
            ("B2", "acct-s1|NGN", 1000),
        ]
        assert Sale.select().where(Sale.buyer_id == "s2", Sale.charge_minor.is_null(False)).count() == 0


# --- concurrency --------------------------------------------------------------------------------


def test_concurrent_leads_never_sell_past_a_buyer_s_cap_nor_a_lead_s_max_sales(api, app, buyer_server, worker):
    """Forty leads from eight threads at once, max 3 sales each, to four shared buyers whose
    daily caps (4, 6, 9, 40) hold fewer sales than the leads would take: every buyer's Redis
    counter and its sales in the ledger stay within its cap, agree, and no lead has more than
    three sales or two to one buyer."""
    caps = {"s1": 4, "s2": 6, "s3": 9, "s4": 40}
    key = _publisher(api, 3)
    stubs = _shared(api, buyer_server, *caps)
    for priority, (name, cap) in enumerate(caps.items(), 1):
        api.put_buyer(name, buyer_server.url(name), priority=priority, contract="shared", caps={"daily": cap})
    api.settle_config()
    n, local, start = 40, threading.local(), threading.Barrier(8)

    def post(i: int) -> dict:
        if getattr(local, "s", None) is None:
            local.s = api.session()
            start.wait()
        resp = api.post_lead(key, {"lead_id": f"K{i}"}, session=local.s)
        assert resp.status_code == 200, resp.text
        return resp.json()

    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(post, range(n)))
    answered = Counter()
    for body in bodies:
        sold = _sold_to(body)
        assert len(sold) <= 3 and len(set(sold)) == len(sold), body
        answered.update(sold)
    for name, cap in caps.items():
        assert _used(api, name) == answered[name] <= cap, name
        assert answered[name] <= len(stubs[name].received)
    assert answered["s1"] == caps["s1"]  # forty leads wanted its four slots: the cap was contended
    for body in bodies:
        api.wait_settled(body["lead_id"], "surge")
    with db.connection_context():
        in_ledger = Counter(s.buyer_id for s in Sale.select())
        per_lead = Counter(s.lead_id for s in Sale.select())
    assert in_ledger == answered
    assert max(per_lead.values()) <= 3
    for name, cap in caps.items():
        assert _used(api, name) == in_ledger[name] <= cap, name


# --- answers -------------------------------------------------------------------------------------


SALES3 = [
    {"buyer_id": "s1", "price": "12.00"},
    {"buyer_id": "s2", "price": "9.50"},
    {"buyer_id": "s3", "price": "7.25"},
]


def test_a_three_sale_answer_is_remembered_and_recalled_as_it_was_given():
    answer = {
        "lead_id": "L1",
        "status": "sold",
        "buyer_id": "s1",
        "price": "12.00",
        "attempts": [
            {"buyer_id": "ex", "outcome": "rejected", "ms": 12},
            {"buyer_id": "s1", "outcome": "accepted", "ms": 30},
            {"buyer_id": "s2", "outcome": "accepted", "ms": 31},
            {"buyer_id": "s3", "outcome": "accepted", "ms": 29},
        ],
        "sales": SALES3,
    }
    remembered = answers.remember(answer)
    assert remembered.startswith("~") and "|s1,s2,s3|12.00,9.50,7.25|" in remembered
    assert len(remembered) <= answers.MAX_INLINE
    assert answers.recall(remembered, "L1", lambda: pytest.fail("inline: the ledger is not asked")) == answer


def test_a_one_sale_answer_is_remembered_in_the_form_before_shared_leads():
    """The compact form of an exclusive sale is as it was (no comma list), and a form remembered
    before shared leads recalls its one sale."""
    attempts = [{"buyer_id": "acme", "outcome": "accepted", "ms": 41}]
    before = {"lead_id": "L1", "status": "sold", "buyer_id": "acme", "price": "12.50", "attempts": attempts}
    now = {**before, "sales": [{"buyer_id": "acme", "price": "12.50"}]}
    assert answers.remember(now) == answers.remember(before)
    assert "," not in answers.remember(now).split("|", 3)[1]
    assert answers.recall(answers.remember(before), "L1", list) == now
    unsold = {"lead_id": "L2", "status": "unsold", "buyer_id": None, "price": None, "attempts": []}
    assert answers.recall(answers.remember(unsold), "L2", list) == unsold


# --- a routing that died mid-wave ----------------------------------------------------------------


def _rules(publisher_id: str):
    with db.connection_context():
        snapshot = load_snapshot(None)
    [publisher] = [p for p in snapshot.publishers_by_key.values() if p.id == publisher_id]
    return snapshot, publisher


def _context(app, publisher_id: str, lead_id: str, lead: dict) -> tuple[LeadContext, Route]:
    """The context a request routing `lead_id` builds (Intake.take), and its route."""
    intake = services.of(app).intake
    snapshot, publisher = _rules(publisher_id)
    now = datetime.now(timezone.utc)
    route = intake.router.select(snapshot, publisher, lead, now, False)
    payload = json.dumps({"lead_id": lead_id, **lead})
    ctx = intake._context(
        publisher=publisher,
        lead_id=lead_id,
        lead=lead,
        payload=payload,
        now=now,
        request_id="req-1",
        test=False,
        route=route,
    )
    return ctx, route


def _die_after_routing(app, publisher_id: str, lead_id: str, lead: dict) -> Outcome:
    """A request that routed the lead through every wave and died before its end (end_lead):
    its yeses' leases held, the attempt note naming them; no claim, no answer."""
    ctx, route = _context(app, publisher_id, lead_id, lead)
    return services.of(app).intake.router.route(ctx, route)


def _die_mid_wave(app, publisher_id: str, lead_id: str, lead: dict, buyer_ids: list[str]) -> list[leases.Lease]:
    """A request that reserved a wave of `buyer_ids` (Sharing, the router's own code: the leases
    and the note naming them in one round trip) and died while offering it."""
    ctx, route = _context(app, publisher_id, lead_id, lead)
    offers = {b.id: Offer(b, b.price) for b in route.buyers}
    sharing = Sharing(services.of(app).intake.router, ctx, Outcome(), json.dumps(lead))
    wave = sharing._reserve([offers[b] for b in buyer_ids], len(buyer_ids))
    assert [o.buyer.id for o, _ in wave] == buyer_ids
    return [lease for _, lease in wave]


def test_a_retry_after_a_routing_died_offers_the_lead_again_to_its_yeses_alone(api, app, buyer_server, worker):
    """The dead routing sold to s1 and s3 (s2 said no); on the retry s1 no longer confirms:
    the lead is sold to s3 alone, each asked with the same Idempotency-Key; s2 and s4 (willing
    now) are not offered it."""
    key = _publisher(api, 2)
    stubs = _shared(api, buyer_server, "s1", "s2", "s3", "s4", modes={"s2": "reject"}, caps={"daily": 10})
    api.settle_config()
    dead = _die_after_routing(app, "surge", "R1", {"state": "TX"})
    assert [dead.buyer_id] + [s.buyer_id for s in dead.more] == ["s1", "s3"]
    note = json.loads(services.of(app).store.redis.get(keys.lead_attempt("surge", "R1")))
    assert [h["buyer_id"] for h in note["shared"]] == ["s1", "s3"]
    assert [_used(api, b) for b in ("s1", "s2", "s3", "s4")] == [1, 0, 1, 0]
    for stub in stubs.values():
        stub.received.clear()
    stubs["s1"].mode, stubs["s2"].mode = "reject", "accept"

    body = api.post_lead(key, {"lead_id": "R1", "state": "TX"}).json()
    assert body["status"] == "sold" and body["sales"] == [{"buyer_id": "s3", "price": "10.00"}]
    asked = {name: [o["headers"]["Idempotency-Key"] for o in s.received] for name, s in stubs.items()}
    assert asked == {"s1": ["surge:R1:s1"], "s2": [], "s3": ["surge:R1:s3"], "s4": []}
    assert [_used(api, b) for b in ("s2", "s3", "s4")] == [0, 1, 0]
    record = api.wait_settled("R1", "surge")
    assert [s["buyer_id"] for s in record["sales"]] == ["s3"]
    replay = api.post_lead(key, {"lead_id": "R1", "state": "TX"}).json()
    assert replay["replayed"] is True and _sold_to(replay) == ["s3"]


def test_a_lease_confirmed_before_the_crash_counts_as_yes_without_asking(api, app, buyer_server, worker):
    key = _publisher(api, 2)
    stubs = _shared(api, buyer_server, "s1", "s2", "s3", caps={"daily": 10})
    api.settle_config()
    s1, _s2 = _die_mid_wave(app, "surge", "R2", {"state": "TX"}, ["s1", "s2"])
    store = services.of(app).store
    leases.finish(store, s1, "accepted", breaker_failures=3, breaker_cooldown_ms=1500)  # s1 said yes

    body = api.post_lead(key, {"lead_id": "R2", "state": "TX"}).json()
    assert body["status"] == "sold" and _sold_to(body) == ["s1", "s2"]
    assert stubs["s1"].received == [] and stubs["s3"].received == []
    [offer] = stubs["s2"].received
    assert offer["headers"]["Idempotency-Key"] == "surge:R2:s2"
    assert [_used(api, b) for b in ("s1", "s2", "s3")] == [1, 1, 0]  # each counted once
    record = api.wait_settled("R2", "surge")
    assert [s["buyer_id"] for s in record["sales"]] == ["s1", "s2"]


def test_a_retry_whose_leases_left_with_the_settlement_answers_the_ledger_s_sales(api, app, buyer_server, worker):
    """The dead request queued its settlement (written since, its leases released) and died
    before it kept its answer: the retry answers the ledger's sales, asking nobody."""
    key = _publisher(api, 2)
    stubs = _shared(api, buyer_server, "s1", "s2", "s3", caps={"daily": 10})
    api.settle_config()
    s1, s2 = _die_mid_wave(app, "surge", "R3", {"state": "TX"}, ["s1", "s2"])
    _, publisher = _rules("surge")
    now = datetime.now(timezone.utc)
    attempts = [
        {"buyer_id": "s1", "outcome": "accepted", "ms": 20},
        {"buyer_id": "s2", "outcome": "accepted", "ms": 21},
    ]
    out = Outcome(attempts=attempts)
    out.sell([Sold("s1", Decimal("10.00"), s1), Sold("s2", Decimal("10.00"), s2)], now)
    item = settlement.make_item(
        publisher=publisher, lead_id="R3", outcome=out, payload="{}", received_at=now, request_id=None
    )
    store = services.of(app).store
    for lease in (s1, s2):
        leases.finish(store, lease, "accepted", breaker_failures=3, breaker_cooldown_ms=1500)
    with db.connection_context():
        ledger.settle([item])
    leases.release_settled(store.redis, [(s1.buyer_id, s1.lease_id), (s2.buyer_id, s2.lease_id)])
    assert not store.redis.exists(s1.key) and not store.redis.exists(s2.key)

    body = api.post_lead(key, {"lead_id": "R3", "state": "TX"}).json()
    assert body["status"] == "sold" and _sold_to(body) == ["s1", "s2"]
    assert body["attempts"] == attempts  # the ledger's
    assert all(s.received == [] for s in stubs.values())
    with db.connection_context():
        assert Sale.select().where(Sale.lead_id == "R3").count() == 2  # settled again: nothing more
    replay = api.post_lead(key, {"lead_id": "R3", "state": "TX"}).json()
    assert replay["replayed"] is True and _sold_to(replay) == ["s1", "s2"]


def test_the_sweep_sells_an_abandoned_wave_once_though_each_lease_finds_its_note(api, app, buyer_server, worker):
    key = _publisher(api, 3)
    stubs = _shared(api, buyer_server, "s1", "s2", "s3", "s4", modes={"s2": "reject"}, caps={"daily": 10})
    api.settle_config()
    _s1, s2, _s3 = _die_mid_wave(app, "surge", "A1", {"state": "TX"}, ["s1", "s2", "s3"])
    svc = services.of(app)
    result = recovery.sweep_all(svc.config, svc.store, svc.queue_redis, svc.queue, 0)
    assert (result.sold, result.unsold, result.left) == (["surge:A1"], [], 0)
    assert [len(stubs[b].received) for b in ("s1", "s2", "s3", "s4")] == [1, 1, 1, 0]
    record = api.wait_settled("A1", "surge")
    assert [s["buyer_id"] for s in record["sales"]] == ["s1", "s3"]
    assert recovery.sweep_all(svc.config, svc.store, svc.queue_redis, svc.queue, 0).as_dict() == {
        "sold": 0,
        "unsold": 0,
        "left": 0,
    }
    replay = api.post_lead(key, {"lead_id": "A1", "state": "TX"}).json()
    assert replay["replayed"] is True and _sold_to(replay) == ["s1", "s3"]
    # each sale counted once; s2's slot stays taken (it may hold the lead) until reconciliation
    assert [_used(api, b) for b in ("s1", "s2", "s3", "s4")] == [1, 1, 1, 0]
    assert services.of(app).store.redis.hget(s2.key, "state") == "held"


def test_a_shared_buyer_not_confirming_the_reoffer_is_an_unknown_attempt_flagged_for_review(
    api, app, buyer_server, worker
):
    """docs/api.md "POST /v1/leads": `unknown` is an attempt whose answer was lost when a process
    died and which the buyer did not confirm when offered the lead again, as reoffer_one records
    it; the lead is flagged for review (its slot stays taken: the buyer may hold the lead)."""
    key = _publisher(api, 2)
    stubs = _shared(api, buyer_server, "s1", "s2", "s3", modes={"s2": "reject"}, caps={"daily": 10})
    api.settle_config()
    _s1, s2 = _die_mid_wave(app, "surge", "U1", {"state": "TX"}, ["s1", "s2"])
    body = api.post_lead(key, {"lead_id": "U1", "state": "TX"}).json()
    assert _sold_to(body) == ["s1"] and stubs["s3"].received == []
    assert services.of(app).store.redis.hget(s2.key, "state") == "held"
    assert {a["buyer_id"]: a["outcome"] for a in body["attempts"]} == {"s1": "accepted", "s2": "unknown"}
    assert api.wait_settled("U1", "surge")["review"] is True
