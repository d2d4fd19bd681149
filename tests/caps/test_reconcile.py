"""Reconciliation of Redis counters with the ledger, and the idempotent periodic schedule."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from redis import Redis
from rq_scheduler import Scheduler

from testkit.servers import Proc, post_lead_until_answered, sold_to, venv_bin, wait_until
from webhooks import config
from webhooks.caps import leases, reconcile
from webhooks.leads.path import answers
from webhooks.leads.rules.catalog import load_snapshot
from webhooks.storage.live.redis import make_store
from workers import schedule


def buyer_rule(buyer_id):
    return next(b for b in load_snapshot(None).buyers if b.id == buyer_id)


def counter(r, buyer_id, cap):
    from datetime import datetime, timezone

    rule = buyer_rule(buyer_id)
    (w,) = [w for c, _, w in leases.windows(rule, datetime.now(timezone.utc)) if c == cap]
    return leases.counter_key(buyer_id, w)


def test_injected_drift_is_corrected_both_ways_and_a_lost_counter_restored(api, buyer_server, worker, redis_server):
    buyer_server.add("acme")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"), caps={"daily": 50, "hourly": 20, "daily_budget": "1000.00"})
    api.settle_config()
    for i in range(7):
        assert api.post_lead(key, {"lead_id": f"r{i}"}).json()["status"] == "sold"
    api.wait_settled("r6", "surge")
    store = make_store(redis_server.url)
    r = store.redis
    daily, hourly, budget = (counter(r, "acme", c) for c in ("daily", "hourly", "daily_budget"))
    r.incrby(daily, 5)  # raised: would refuse leads that could be sold
    r.decrby(hourly, 3)  # lowered: would sell past the cap
    r.delete(budget)  # lost
    findings = {f.cap: f for f in reconcile.reconcile_buyer(store, r, buyer_rule("acme"))}
    assert (findings["daily"].counter, findings["daily"].expected) == (12, 7)
    assert (findings["hourly"].counter, findings["hourly"].expected) == (4, 7)
    assert (findings["daily_budget"].counter, findings["daily_budget"].expected) == (0, 7000)
    assert (int(r.get(daily)), int(r.get(hourly)), int(r.get(budget))) == (7, 7, 7000)
    assert r.ttl(budget) > 0
    # a second pass finds nothing to correct
    assert all(f.corrected_to is None for f in reconcile.reconcile_buyer(store, r, buyer_rule("acme")))


def test_a_lease_in_flight_is_not_reconciled_away(api, buyer_server, redis_server, worker):
    buyer_server.add("slow", "sleep", delay=1.0)
    key = api.put_publisher("surge")
    api.put_buyer("slow", buyer_server.url("slow"), caps={"daily": 1})
    api.settle_config()
    store = make_store(redis_server.url)
    r = store.redis
    first = {}
    t = threading.Thread(target=lambda: first.update(r=api.post_lead(key, {"lead_id": "slow-1"}).json()))
    t.start()
    wait_until(
        lambda: buyer_server.buyers["slow"].received or r.get(counter(r, "slow", "daily")) == "1",
        what="the lease to be taken",
    )
    findings = reconcile.reconcile_buyer(store, r, buyer_rule("slow"))
    assert findings[0].expected == 1 and findings[0].corrected_to is None
    assert api.post_lead(key, {"lead_id": "slow-2"}).json()["status"] == "unsold"
    t.join()
    assert first["r"]["status"] == "sold"


def test_reconciliation_during_live_traffic_never_lets_a_cap_be_exceeded(api, buyer_server, redis_server, worker):
    acme = buyer_server.add("live", delay=0.02)
    key = api.put_publisher("surge")
    api.put_buyer("live", buyer_server.url("live"), caps={"daily": 100})
    api.settle_config()
    store = make_store(redis_server.url)
    r = store.redis
    stop = threading.Event()
    passes = []
    rule = buyer_rule("live")

    def reconcile_loop():
        while not stop.is_set():
            passes.append(reconcile.reconcile_buyer(store, r, rule))

    loop = threading.Thread(target=reconcile_loop)
    loop.start()

    def one(i):
        return post_lead_until_answered(api.session(), api.base, key, {"lead_id": f"live-{i}"})

    try:
        with ThreadPoolExecutor(50) as pool:
            replies = list(pool.map(one, range(1000)))
    finally:
        stop.set()
        loop.join()
    assert len(passes) >= 2  # it really ran while leads were sold
    sold = sold_to("live", acme, replies, cap=100)  # a post the deadline cut off: accepted by the stub, unsold
    wait_until(
        lambda: (
            api.get("/v1/admin/leads/live-0").status_code in (200, 404)
            and all(f.corrected_to is None for f in reconcile.reconcile_buyer(store, r, buyer_rule("live")))
        ),
        timeout=20,
        what="a clean reconciliation",
    )
    assert int(r.get(counter(r, "live", "daily"))) == len(sold)


def test_a_post_the_deadline_cut_off_is_accepted_by_the_buyer_but_not_sold_nor_counted(api, buyer_server, redis_server):
    """What a busy machine does to a few posts of the test above, on purpose: the stub accepts
    after BUYER_TIMEOUT_MS (1.5 s). The stub counts a purchase; Floodgate a timeout, no sale,
    the slot given back."""
    late = buyer_server.add("late", "sleep", delay=2.0)
    key = api.put_publisher("surge")
    api.put_buyer("late", buyer_server.url("late"), caps={"daily": 1})
    api.settle_config()
    replies = [api.post_lead(key, {"lead_id": "late-1"}).json()]
    # failed once in CI (not reproduced): the reply says whether the lead was offered at all
    wait_until(lambda: late.received, what=f"the stub to answer once its sleep is over (reply {replies[0]})")
    assert late.accepted == 1 and sold_to("late", late, replies) == set()
    assert replies[0]["attempts"][0]["outcome"] == "timeout"
    r = make_store(redis_server.url).redis
    assert int(r.get(counter(r, "late", "daily")) or 0) == 0


@pytest.mark.e2e  # two scheduler processes
def test_scheduler_started_twice_schedules_each_periodic_job_once(redis_server, base_env, tmp_path):
    url = f"redis://127.0.0.1:{redis_server.port}/7"
    conn = Redis.from_url(url)
    conn.flushdb()
    env = {**base_env, "REDIS_URL": url}
    procs = [Proc([venv_bin("python"), "-m", "workers.schedule"], env, tmp_path / f"s{i}.log") for i in range(2)]
    try:
        scheduler = Scheduler(queue_name="floodgate", connection=conn)

        def periodic():
            return [j for j in scheduler.get_jobs() if j.id.startswith(schedule.ID_PREFIX)]

        # PERIODIC and the provider reconciliation, every PROVIDER_RECONCILE_INTERVAL_S of `env`
        definitions = schedule.periodic(config.load(env))
        wait_until(lambda: len(periodic()) >= len(definitions), what="the periodic jobs")
        wait_until(lambda: all("Registering birth" in p.output() for p in procs), what="both schedulers to start")
        assert all(p.alive() for p in procs)
        assert sorted(j.func_name for j in periodic()) == sorted(d["func"] for d in definitions)
        # and once more in-process
        assert schedule.register(scheduler, definitions) == schedule.register(scheduler, definitions)
        assert len(periodic()) == len(definitions)
    finally:
        for p in procs:
            p.stop()
        conn.flushdb()


def test_a_replaced_periodic_job_gives_back_the_batches_it_held(queue_server):
    """A periodic job whose definition changed (an upgrade) is cancelled and scheduled under a
    new id; the batches its last run held (an outage, a kill) would wait for a run of the old
    id for ever. They are queued again."""
    from webhooks.storage.live import keys

    conn = Redis(port=queue_server.port, db=6)  # rq-scheduler's Redis: a single one in every deployment
    conn.flushdb()
    try:
        scheduler = Scheduler(queue_name="floodgate", connection=conn)
        old = {"func": "workers.settle.drain", "interval": 60, "description": "an older definition"}
        [old_id] = schedule.register(scheduler, [old])
        conn.rpush(keys.settle_processing(old_id), b"s1", b"s2")
        conn.rpush(keys.webhook_calls_processing(old_id), b"d1")
        conn.lpush(keys.SETTLE_PENDING, b"s3")
        schedule.register(scheduler)
        assert conn.lrange(keys.SETTLE_PENDING, 0, -1) == [b"s3", b"s2", b"s1"]  # taken from the right: s1 first
        assert conn.lrange(keys.WEBHOOK_CALLS_PENDING, 0, -1) == [b"d1"]
        assert not conn.exists(keys.settle_processing(old_id), keys.webhook_calls_processing(old_id))
    finally:
        conn.flushdb()


def test_the_unsettled_sales_of_one_buyer_are_found_without_decoding_the_others(redis_server):
    """A rebuild reads the settlement queue for one buyer: every item that names the buyer
    (however it was encoded) is decoded, an item sold to a buyer whose id merely starts the
    same is not."""
    import json

    from webhooks.storage.live import keys, settle_queue

    r = redis_server.client()
    items = [
        {"lead_id": "a", "status": "sold", "buyer_id": "acme", "payload": "{}"},
        {"lead_id": "b", "status": "sold", "buyer_id": "acme-2", "payload": "{}"},
        {
            "lead_id": "c",
            "status": "sold",
            "buyer_id": "zen",
            "payload": "{}",
            "attempts": [{"buyer_id": "acme", "outcome": "rejected"}],
        },
    ]  # decoded, as it names acme
    r.lpush(keys.SETTLE_PENDING, json.dumps(items[0], indent=2), *(json.dumps(i) for i in items[1:]))
    r.rpush(keys.settle_processing("job-1"), json.dumps({**items[0], "lead_id": "d"}, separators=(",", ":")))
    found = {i["lead_id"] for i in settle_queue.unsettled(r, mentioning="acme")}
    assert found == {"a", "c", "d"}
    assert {i["lead_id"] for i in settle_queue.unsettled(r)} == {"a", "b", "c", "d"}


def test_a_rebuild_counts_the_ledger_in_the_database_and_each_queued_sale_once(
    api, buyer_server, worker_manager, queue_server
):
    """After a data loss the queue holds journals pushed again: sales already in the ledger,
    some twice. The rebuild's counts (the ledger's by SQL aggregate, plus the queued sales it
    does not have) equal the sales, as the row-by-row count of reconciliation finds them."""
    import json
    from datetime import datetime, timedelta, timezone

    from webhooks.caps import rebuild
    from webhooks.caps.sales import sales_since, total
    from webhooks.storage.live import keys

    # before the first sale (the ledger may keep whole seconds): every sale of the test is after it
    started = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(seconds=1)
    buyer_server.add("tally")
    key = api.put_publisher("surge")
    api.put_buyer(
        "tally", buyer_server.url("tally"), price="12.35", caps={"hourly": 100, "daily": 100, "daily_budget": "900.00"}
    )
    api.settle_config()
    r = queue_server.client()  # the settlement lists' Redis
    worker_manager.stop()
    for i in range(9):
        assert api.post_lead(key, {"lead_id": f"t{i}"}).json()["status"] == "sold"
    settled_raw = r.lrange(keys.SETTLE_PENDING, 0, -1)
    worker_manager.ensure()
    api.wait_settled("t8", "surge")
    wait_until(lambda: r.llen(keys.SETTLE_PENDING) == 0, what="the queue drained")
    worker_manager.stop()
    for i in range(9, 12):  # queued only
        assert api.post_lead(key, {"lead_id": f"t{i}"}).json()["status"] == "sold"
    queued_raw = r.lrange(keys.SETTLE_PENDING, 0, -1)
    r.lpush(keys.SETTLE_PENDING, *settled_raw[:4], queued_raw[0])  # journals pushed again
    assert len({json.loads(x)["lead_id"] for x in r.lrange(keys.SETTLE_PENDING, 0, -1)}) == 7

    rule, now = buyer_rule("tally"), datetime.now(timezone.utc)
    counts = rebuild.sold_counts(r, rule, now)
    found = sales_since(r, "tally", started).values()
    assert len(found) == 12  # each sale once, wherever it is and however often it was queued
    # Each cap counts the sales inside its current window: all 12, unless an hour (or a day)
    # began while the test ran, and then the ones after it (CI once crossed 06:00 here).
    windows = leases.windows(rule, now)
    assert counts == {cap: total(found, cap, w) for cap, _, w in windows}
    if all(w.start <= started for _, _, w in windows):
        assert counts == {"hourly": 12, "daily": 12, "daily_budget": 12 * 1235}


def test_a_rebuild_asked_for_after_the_counters_were_rebuilt_is_not_started(redis_server, api, buyer_server):
    """A busy process can read a `not_ready` answer after another process's rebuild has
    finished: it must not start a second one (the soak saw every buyer rebuilt twice)."""
    from webhooks.caps import rebuild
    from webhooks.storage.live import keys

    api.put_buyer("twice", buyer_server.url("twice"))
    store = make_store(redis_server.url)
    assert store.redis.exists(keys.ready("twice"))  # counters trusted
    assert rebuild.request(store, store.redis, buyer_rule("twice"), 1500) is False
    assert not store.redis.exists(keys.rebuild_lock("twice"))


def test_after_a_loss_a_journal_pushes_again_only_what_the_ledger_lacks_and_restores_every_answer(
    api, redis_server, queue_server
):
    """The soak's Redis restart re-queued 68,000 journaled settlements, nearly all in the
    ledger already: the worker drained them again for a minute and every counter rebuild read
    them. Only the ones the ledger lacks are pushed again; every answer is put back."""
    import json
    from datetime import datetime, timezone
    from decimal import Decimal

    from webhooks.caps.leases import Lease
    from webhooks.leads.accounting import ledger
    from webhooks.leads.path import settlement
    from webhooks.leads.path.routing import Outcome
    from webhooks.leads.rules.publishers import PublisherRule
    from webhooks.storage.live import keys
    from webhooks.storage.live.settle_queue import queue
    from webhooks.storage.records.db import db

    api.put_publisher("surge")
    store = make_store(redis_server.url)  # the claims' Redis (a cluster in the cluster run)
    # The settlement lists and their RQ queue on a database of their own: the run's RQ worker
    # (started by an earlier test under xdist) drains db 0, and would settle these items first.
    r = queue_server.client(db=7)
    journal = settlement.Journal(r, queue(Redis(port=queue_server.port, db=7)), 600, claims=store)
    journal._watcher = threading.current_thread()  # no watcher thread: this test calls check_epoch itself
    pub = PublisherRule(id="surge", active=True, payout_pct=Decimal("10"))
    items = []
    for i in range(5):
        out = Outcome(
            status="sold",
            buyer_id="acme",
            price=Decimal("20.00"),
            sold_at=datetime.now(timezone.utc),
            lease=Lease("acme", f"lease-j{i}", ()),
            attempts=[{"buyer_id": "acme", "outcome": "accepted", "ms": 5}],
        )
        items.append(
            settlement.make_item(
                publisher=pub,
                lead_id=f"j{i}",
                outcome=out,
                payload="{}",
                received_at=datetime.now(timezone.utc),
                request_id=None,
            )
        )
        journal.push(items[-1])
    journal.check_epoch()  # the epoch this process knows
    with db.connection_context():
        assert ledger.settle(items[:3]) == 3  # the worker settled three of them
    r.flushall()  # Redis restarted empty: the queue, the claims and the epoch are gone
    for key in [keys.lead_claim("surge", f"j{i}") for i in range(5)]:
        store.redis.delete(key)  # (the claims' Redis is another one beside a cluster)

    assert journal.check_epoch() == 2
    assert sorted(json.loads(x)["lead_id"] for x in r.lrange(keys.SETTLE_PENDING, 0, -1)) == ["j3", "j4"]
    for i in range(5):
        assert answers.recall(store.redis.get(keys.lead_claim("surge", f"j{i}")), f"j{i}", list)["buyer_id"] == "acme"
