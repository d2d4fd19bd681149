"""A remembered lead_id answer costs Redis at most 200 bytes (docs/api.md "Data kept per lead is
bounded") and a replay still answers the first outcome, `"replayed": true`: real Redis
(MEMORY USAGE), database and HTTP buyers."""

from __future__ import annotations

import pytest

from webhooks import services
from webhooks.leads.path import answers
from webhooks.storage.live import keys

ATTEMPTS = [
    {"buyer_id": "zen", "outcome": "rejected", "ms": 12},
    {"buyer_id": "kilo", "outcome": "error", "ms": 1500},
    {"buyer_id": "acme", "outcome": "accepted", "ms": 41, "bid": "9.50"},
]


@pytest.mark.parametrize(
    "answer",
    [
        {
            "lead_id": "L1",
            "status": "sold",
            "buyer_id": "acme",
            "price": "12.50",
            "attempts": ATTEMPTS,
            "sales": [{"buyer_id": "acme", "price": "12.50"}],
        },
        {"lead_id": "L1", "status": "unsold", "buyer_id": None, "price": None, "attempts": ATTEMPTS[:2]},
        {"lead_id": "L1", "status": "unsold", "buyer_id": None, "price": None, "attempts": []},
        {"lead_id": "L1", "status": "sold", "buyer_id": "acme", "price": "10.00", "attempts": [], "test": True},
        {"lead_id": "L1", "status": "unsold", "buyer_id": None, "price": None, "attempts": [], "test": True},
    ],
)
def test_a_remembered_answer_is_recalled_as_it_was_given(answer):
    remembered = answers.remember(answer)
    assert len(remembered) <= answers.MAX_INLINE
    assert answers.recall(remembered, "L1", lambda: pytest.fail("inline: the ledger is not asked")) == answer


def test_attempts_that_do_not_fit_are_the_ledgers_and_a_replay_waits_for_it():
    many = [{"buyer_id": f"buyer-with-a-long-name-{i}", "outcome": "timeout", "ms": 1500} for i in range(12)]
    answer = {"lead_id": "L1", "status": "unsold", "buyer_id": None, "price": None, "attempts": many}
    remembered = answers.remember(answer)
    assert len(remembered) <= answers.MAX_INLINE
    assert answers.recall(remembered, "L1", lambda: many) == answer
    with pytest.raises(answers.AttemptsPending):
        answers.recall(remembered, "L1", lambda: None)


def test_an_answer_remembered_as_json_before_still_replays():
    old = '{"lead_id": "L1", "status": "sold", "buyer_id": "acme", "price": "12.50", "attempts": []}'
    assert answers.recall(old, "L1", list)["buyer_id"] == "acme"


def _three_buyers(api, buyer_server) -> str:
    buyer_server.add("zen", "reject")
    buyer_server.add("kilo", "error500")
    buyer_server.add("acme")
    key = api.put_publisher("surge", commission_pct="10")
    for priority, name in enumerate(("zen", "kilo", "acme"), 1):
        api.put_buyer(name, buyer_server.url(name), priority=priority, price="12.50")
    api.settle_config()
    return key


def test_a_remembered_lead_id_costs_redis_at_most_200_bytes(api, app, buyer_server):
    key = _three_buyers(api, buyer_server)
    r = services.of(app).store.redis
    sizes = []
    for body in ({}, {"lead_id": "surge-000123"}, {"lead_id": "x" * 40}):  # generated: 32 characters
        first = api.post_lead(key, body).json()
        assert (first["status"], len(first["attempts"])) == ("sold", 3)
        sizes.append(r.memory_usage(keys.lead_claim("surge", first["lead_id"]), samples=0))
    assert max(sizes) <= 200, sizes


def test_a_replay_answers_the_first_outcome_from_the_compact_form_and_from_the_ledger(
    api, app, buyer_server, worker, monkeypatch
):
    key = _three_buyers(api, buyer_server)
    first = api.post_lead(key, {"lead_id": "R1", "email": "ada@example.com"}).json()
    again = api.post_lead(key, {"lead_id": "R1", "email": "ada@example.com"}).json()
    assert again == {**first, "replayed": True}
    # attempts left to the ledger: read back from it once settled
    monkeypatch.setattr(answers, "MAX_INLINE", 10)
    first = api.post_lead(key, {"lead_id": "R2"}).json()
    assert services.of(app).store.redis.get(keys.lead_claim("surge", "R2")).endswith("|*3")
    api.wait_settled("R2", "surge")
    assert api.post_lead(key, {"lead_id": "R2"}).json() == {**first, "replayed": True}
    test = api.post_lead(key, {"lead_id": "T1", "test": True}).json()
    assert api.post_lead(key, {"lead_id": "T1", "test": True}).json() == {**test, "replayed": True}
