"""The settlement item's JSON is a contract between releases: a web process of the running
release queues items that a worker of the next one settles, and the other way round during a
deploy. The strings below are what the release before SettlementItem queued for the same
leads (its journal, its abandoned-lead sweep, a journal that dropped a body), byte for byte."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from decimal import Decimal

from webhooks import services
from webhooks.leads.accounting.item import SettlementItem
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.live import settle_queue
from webhooks.storage.live.scripts import Lease
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, Publisher
from webhooks.storage.states import LeadStatus

PUB = PublisherRule(id="pub", active=True, payout_pct=Decimal("10"))
AT = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=timezone.utc)
SOLD_AT = datetime(2026, 12, 1, 9, 30, 16, 5, tzinfo=timezone.utc)
SOLD_OUTCOME = Outcome(
    status=LeadStatus.SOLD,
    buyer_id="acme",
    price=Decimal("12.50"),
    sold_at=SOLD_AT,
    lease=Lease(buyer_id="acme", lease_id="lease-1", counters=(), reserved_us=1733045415123456),
    attempts=[
        {"buyer_id": "zen", "outcome": "timeout", "ms": 1500},
        {"buyer_id": "acme", "outcome": "accepted", "ms": 41, "bid": "12.50"},
    ],
    skipped=[{"buyer_id": "old", "reason": "inactive"}],
)
SOLD_PAYLOAD = '{"lead_id": "g-sold", "name": "Zoë 😀", "state": "TX"}'

# What the earlier release queued: its journal (UTF-8 as is) ...
SOLD = (
    '{"publisher_id":"pub","lead_id":"g-sold","status":"sold","buyer_id":"acme","price":"12.50",'
    '"commission":"1.25","attempts":[{"buyer_id":"zen","outcome":"timeout","ms":1500},'
    '{"buyer_id":"acme","outcome":"accepted","ms":41,"bid":"12.50"}],"skipped":[{"buyer_id":"old",'
    '"reason":"inactive"}],"payload":"{\\"lead_id\\": \\"g-sold\\", \\"name\\": \\"Zoë 😀\\", '
    '\\"state\\": \\"TX\\"}","received_at":"2026-12-01T09:30:15.123456+00:00",'
    '"sold_at":"2026-12-01T09:30:16.000005+00:00","lease":["acme","lease-1"],'
    '"reserved_us":1733045415123456,"request_id":"req-1"}'
)
# ... its abandoned-lead sweep (non-ASCII escaped) ...
SOLD_BY_SWEEP = SOLD.replace("Zoë 😀", "Zo\\u00eb \\ud83d\\ude00")
UNSOLD = (
    '{"publisher_id":"pub","lead_id":"g-unsold","status":"unsold","buyer_id":null,"price":null,'
    '"commission":null,"attempts":[{"buyer_id":"zen","outcome":"rejected","ms":12}],"skipped":[],'
    '"payload":"{\\"lead_id\\": \\"g-unsold\\"}","received_at":"2026-12-01T09:30:15.123456+00:00",'
    '"sold_at":null,"lease":null,"reserved_us":null,"request_id":null}'
)
TEST = (
    '{"publisher_id":"pub","lead_id":"g-test","status":"test_sold","buyer_id":"acme","price":"12.50",'
    '"commission":null,"attempts":[],"skipped":[{"buyer_id":"old","reason":"inactive"}],'
    '"payload":"{\\"lead_id\\": \\"g-test\\"}","received_at":"2026-12-01T09:30:15.123456+00:00",'
    '"sold_at":null,"lease":null,"reserved_us":null,"request_id":"req-2"}'
)
# ... and a journal's re-push of a sale whose body its memory budget had dropped.
DROPPED = (
    SOLD.replace(
        '"payload":"{\\"lead_id\\": \\"g-sold\\", \\"name\\": \\"Zoë 😀\\", \\"state\\": \\"TX\\"}"', '"payload":""'
    )[:-1]
    + ',"payload_dropped":true}'
)


def test_the_golden_strings_are_what_they_claim():
    assert json.loads(SOLD_BY_SWEEP) == json.loads(SOLD)
    assert json.loads(DROPPED)["payload"] == "" and json.loads(DROPPED)["payload_dropped"] is True
    assert json.loads(SOLD)["payload"] == SOLD_PAYLOAD


def test_an_item_is_queued_as_the_running_release_queues_it():
    sold = settlement.make_item(
        publisher=PUB, lead_id="g-sold", outcome=SOLD_OUTCOME, payload=SOLD_PAYLOAD, received_at=AT, request_id="req-1"
    )
    assert sold.to_json() == SOLD
    assert json.dumps(sold.to_dict(), separators=(",", ":")) == SOLD_BY_SWEEP  # the sweep's form
    unsold = settlement.make_item(
        publisher=PUB,
        lead_id="g-unsold",
        outcome=Outcome(attempts=[{"buyer_id": "zen", "outcome": "rejected", "ms": 12}]),
        payload='{"lead_id": "g-unsold"}',
        received_at=AT,
        request_id=None,
    )
    assert unsold.to_json() == UNSOLD
    test = settlement.make_item(
        publisher=PUB,
        lead_id="g-test",
        outcome=SOLD_OUTCOME,
        payload='{"lead_id": "g-test"}',
        received_at=AT,
        request_id="req-2",
        test=True,
    )
    assert test.to_json() == TEST


def test_a_journal_pushes_again_the_bytes_it_pushed_and_flags_a_dropped_body():
    sold = SettlementItem.from_json(SOLD)
    head = replace(sold, payload="").to_json()
    kept = settlement._Entry(
        at=0.0, head=head, payload=settlement._pack(SOLD_PAYLOAD), answer="", lead=("pub", "g-sold")
    )
    dropped = settlement._Entry(at=0.0, head=head, payload=None, answer="", lead=("pub", "g-sold"))
    assert kept.raw() == SOLD
    assert dropped.raw() == DROPPED


def test_every_queued_form_reads_back_to_the_same_item_and_bytes():
    for raw in (SOLD, UNSOLD, TEST, DROPPED):
        assert SettlementItem.from_json(raw).to_json() == raw
        assert SettlementItem.from_json(raw.encode()).to_json() == raw  # as RQ's Redis hands it over
    assert SettlementItem.from_json(SOLD_BY_SWEEP) == SettlementItem.from_json(SOLD)
    sold = SettlementItem.from_json(SOLD)
    assert (sold.payout, sold.lease, sold.sold) == ("1.25", ("acme", "lease-1"), True)
    assert SettlementItem.from_json(DROPPED).payload_dropped


def _older(raw: str, lead_id: str) -> str:
    """An item of an older release still: without the keys added since (trace, reservation
    time, request id), and with one a newer release might add."""
    item = json.loads(raw)
    for key in ("skipped", "reserved_us", "request_id"):
        del item[key]
    item.update(lead_id=lead_id, added_later={"x": 1})
    return json.dumps(item, separators=(",", ":"), ensure_ascii=False)


def test_items_the_running_release_queued_are_settled_by_this_one(api, app, worker):
    """The bytes of the earlier release, on the settlement list, drained by the worker."""
    api.put_publisher("pub", commission_pct="10")
    raws = [
        SOLD,
        SOLD_BY_SWEEP.replace('"lead_id":"g-sold"', '"lead_id":"g-sweep"', 1),
        UNSOLD,
        TEST,
        DROPPED.replace('"lead_id":"g-sold"', '"lead_id":"g-dropped"', 1),
        _older(SOLD, "g-older"),
    ]
    svc = services.of(app)
    settle_queue.push(svc.queue_redis.redis, svc.queue, raws)
    records = {lead_id: api.wait_settled(lead_id, "pub") for lead_id in ("g-sold", "g-sweep", "g-dropped", "g-older")}
    for lead_id, record in records.items():
        assert (record["status"], record["buyer_id"], record["price"], record["commission"]) == (
            "sold",
            "acme",
            "12.50",
            "1.25",
        ), lead_id
        assert [a["outcome"] for a in record["attempts"]] == ["timeout", "accepted"]
    assert records["g-sold"]["skipped"] == [{"buyer_id": "old", "reason": "inactive"}]
    assert records["g-older"]["skipped"] == []
    assert api.wait_settled("g-unsold", "pub")["status"] == "unsold"
    test = api.wait_settled("g-test", "pub")
    assert (test["status"], test["test"], test["commission"]) == ("sold", True, None)
    with db.connection_context():
        assert f"{Publisher.get_by_id('pub').balance:.2f}" == "5.00"  # four sales at 1.25, no test lead
        bodies = {r.lead_id: r.payload for r in Lead.select().where(Lead.publisher_id == "pub")}
    assert bodies["g-sold"] == SOLD_PAYLOAD == bodies["g-sweep"] and bodies["g-dropped"] == ""
