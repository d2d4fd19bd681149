"""One consumer, one key (docs/api.md "Fifth round: the seams"): every spelling of a listed or
bought consumer meets the suppression list, the buyer's dedupe and the pre-ping, with or without
a field spec; a value that is not a string where one is checked is 400 invalid_lead; plain
lists hold keyed hashes, never a bare digest, and lists written before are rehashed from the
database. Against the real app, Redis and database."""

from __future__ import annotations

import hashlib
import hmac
import threading
from concurrent.futures import ThreadPoolExecutor
from unittest.mock import ANY

import pytest

from testkit.servers import post_lead_until_answered
from tests.formats.test_consumer import EMAIL, EMAIL_SPELLINGS, PHONE, PHONE_SPELLINGS
from webhooks import services
from webhooks.formats.consumer import DEFAULT_SUPPRESSION_KEY
from webhooks.leads.rules import suppression, suppression_rehash
from webhooks.storage.live import keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead, SuppressionEntry, SuppressionList

SPEC = {"email": {"type": "email"}, "phone": {"type": "phone", "region": "US"}}
SPELLINGS = [("phone", s) for s in PHONE_SPELLINGS] + [("email", s) for s in EMAIL_SPELLINGS]
NOT_STRINGS = [["+15125550111"], 15125550111, {"n": "+15125550111"}, True, [[[["victim@example.com"]]]]]


def put_list(api, list_id: str, field: str, kind: str = "none") -> None:
    resp = api.http.put(
        f"{api.base}/v1/admin/suppression-lists/{list_id}", json={"field": field, "hash": kind}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text


def add(api, list_id: str, *values: str) -> dict:
    resp = api.http.post(
        f"{api.base}/v1/admin/suppression-lists/{list_id}/entries", json={"add": list(values)}, headers=api.admin
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def check(api, key: str, body: dict) -> dict:
    resp = api.http.post(f"{api.base}/v1/leads/check", json=body, headers={"Authorization": f"Bearer {key}"})
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.fixture(params=[None, SPEC], ids=["no-spec", "spec"])
def spec(request):
    return request.param


@pytest.fixture
def listed(api, buyer_server, spec):
    """Publisher `strict` refuses the consumers of its plain lists (PHONE, EMAIL); publisher
    `open` does not, and buyer `careful` (priority 1) skips those of its md5 and sha256 lists
    (the partners' digests of the same consumer) for `spare` (priority 2)."""
    for name in ("careful", "spare"):
        buyer_server.add(name)
    for list_id, field, kind in (("p-phone", "phone", "none"), ("p-email", "email", "none")):
        put_list(api, list_id, field, kind)
    put_list(api, "b-phone", "phone", "sha256")
    put_list(api, "b-email", "email", "md5")
    add(api, "p-phone", "(512) 555-0111")
    add(api, "p-email", "Victim@Example.com")
    add(api, "b-phone", hashlib.sha256(PHONE.encode()).hexdigest())
    add(api, "b-email", hashlib.md5(EMAIL.encode()).hexdigest())
    fields = {"fields": spec} if spec else {}
    strict = api.put_publisher("strict", suppress=["p-phone", "p-email"], **fields)
    open_ = api.put_publisher("open", **fields)
    api.put_buyer("careful", buyer_server.url("careful"), priority=1, suppress=["b-phone", "b-email"])
    api.put_buyer("spare", buyer_server.url("spare"), priority=2)
    api.settle_config()
    return strict, open_


def test_every_spelling_of_a_listed_consumer_is_suppressed(api, listed, buyer_server):
    strict, open_ = listed
    for i, (field, spelled) in enumerate(SPELLINGS):
        body = {"lead_id": f"s-{i}", field: spelled}
        answer = api.post_lead(strict, body).json()
        assert answer.get("reason") == "suppressed", (spelled, answer)
        assert check(api, strict, {**body, "lead_id": f"c-{i}"})["eligible"] is False, spelled
        sold = api.post_lead(open_, {**body, "lead_id": f"o-{i}"}).json()
        assert [a["buyer_id"] for a in sold["attempts"]] == ["spare"], (spelled, sold)  # careful: not offered
    assert not buyer_server.buyers["careful"].arrived  # nobody on its lists ever reached it
    # another consumer passes both
    assert api.post_lead(strict, {"lead_id": "s-x", "phone": "+15125550112"}).json()["buyer_id"] == "careful"


def test_every_spelling_of_a_bought_consumer_is_a_duplicate(api, buyer_server, spec):
    buyer_server.add("dd")
    buyer_server.add("spare")
    key = api.put_publisher("pub", **({"fields": spec} if spec else {}))
    api.put_buyer("dd", buyer_server.url("dd"), priority=1, dedupe={"fields": ["email", "phone"], "days": 30})
    api.put_buyer("spare", buyer_server.url("spare"), priority=2)
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "first-p", "phone": "+15125550111"}).json()["buyer_id"] == "dd"
    assert api.post_lead(key, {"lead_id": "first-e", "email": "victim@example.com"}).json()["buyer_id"] == "dd"
    for i, (field, spelled) in enumerate(SPELLINGS):
        body = {"lead_id": f"d-{i}", field: spelled}
        # a pre-ping tells nothing of who bought the consumer (docs/leads.md "What a pre-ping may tell")
        assert check(api, key, {**body, "lead_id": f"c-{i}"}) == {"eligible": True, "duplicate": False}, spelled
        answer = api.post_lead(key, body).json()
        assert answer["buyer_id"] == "spare", (spelled, answer)
    assert len(buyer_server.buyers["dd"].arrived) == 2  # sold each consumer once


def test_concurrent_leads_of_one_consumer_spelled_every_way_reach_a_dedupe_buyer_once(api, buyer_server):
    buyer_server.add("dd")
    buyer_server.add("spare")
    key = api.put_publisher("pub")
    api.put_buyer("dd", buyer_server.url("dd"), priority=1, dedupe={"fields": ["phone"], "days": 30})
    api.put_buyer("spare", buyer_server.url("spare"), priority=2)
    api.settle_config()
    start = threading.Barrier(len(PHONE_SPELLINGS))

    def post(i: int) -> dict:
        http = api.session()
        start.wait()
        return post_lead_until_answered(http, api.base, key, {"lead_id": f"t-{i}", "phone": PHONE_SPELLINGS[i]})

    with ThreadPoolExecutor(len(PHONE_SPELLINGS)) as pool:
        answers = list(pool.map(post, range(len(PHONE_SPELLINGS))))
    failed = any(t["buyer_id"] == "dd" and t["outcome"] != "accepted" for a in answers for t in a["attempts"])
    sold = [a for a in answers if a.get("buyer_id") == "dd"]
    assert len(sold) <= 1, answers  # the invariant: the buyer bought the consumer once at most
    assert len(sold) == 1 or failed, answers  # and once, unless its deliveries failed (each frees it)


@pytest.mark.parametrize("value", NOT_STRINGS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("field", ["phone", "email"])
def test_a_value_that_is_not_a_string_where_a_list_or_dedupe_checks_is_400(
    api, buyer_server, redis_server, field, value
):
    buyer_server.add("b")
    put_list(api, "dnc", field)
    listed = api.put_publisher("listed", suppress=["dnc"])
    plain = api.put_publisher("plain")
    api.put_buyer("b", buyer_server.url("b"), dedupe={"fields": ["phone"], "days": 30})
    api.settle_config()
    before = sorted(k for k in redis_server.client().keys("*") if "config" not in k and k != keys.ERASURES_SEEN)
    for key, lead_id in ((listed, "n-1"), (plain, "n-2")):
        resp = api.post_lead(key, {"lead_id": lead_id, field: value})
        if key == plain and field == "email":  # nothing checks this publisher's e-mail: it passes through
            assert resp.status_code == 200, resp.text
            continue
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert (error["code"], error["fields"]) == ("invalid_lead", {field: "must be a string"})
        pre = api.http.post(
            f"{api.base}/v1/leads/check",
            json={"lead_id": "n-c", field: value},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert (pre.status_code, pre.json()["error"]["fields"]) == (400, {field: "must be a string"})
    after = sorted(k for k in redis_server.client().keys("*") if "config" not in k and k != keys.ERASURES_SEEN)
    if field == "phone":
        assert after == before  # no claim, lease, counter or settlement
    with db.connection_context():
        assert Lead.select().where(Lead.lead_id == "n-1").count() == 0


def test_a_256_kib_value_is_read_through_its_padding_or_refused(api, listed, spec):
    """Without a spec, padding around a listed consumer cannot hide it; a spec refuses such a
    value (400); a value too long to be a phone or an address is refused either way."""
    strict, _ = listed
    room = 250 * 1024  # the whole body is at most 256 KiB (MAX_BODY_BYTES); U+200B is sent as \\u200b
    for i, (field, value) in enumerate(
        [("phone", " " * room + "+1 512 555 0111#"), ("email", "\u200b" * (room // 9) + EMAIL + "\t" * (room // 9))]
    ):
        resp = api.post_lead(strict, {"lead_id": f"big-{i}", field: value})
        if spec:
            assert resp.status_code == 400 and resp.json()["error"]["fields"] == {field: ANY}, resp.text[:300]
        else:
            assert resp.json().get("reason") == "suppressed", resp.text[:300]
    resp = api.post_lead(strict, {"lead_id": "big-3", "phone": "5" * room})
    assert (resp.status_code, resp.json()["error"]["code"]) == (400, "invalid_lead"), resp.text[:300]
    assert list(resp.json()["error"]["fields"]) == ["phone"]


def bare(value: str) -> bytes:
    """What sql/018 stored for a plain list: the first 16 bytes of the SHA-256."""
    return hashlib.sha256(value.encode()).digest()[:16]


def redis_fields(r, list_id: str) -> set[bytes]:
    """Every digest Redis holds of the list (bucket name and field put back together)."""
    prefix = keys.suppression_bucket(list_id, "")
    found = set()
    for bucket in r.keys(prefix + "*"):
        head = bytes.fromhex(bucket.decode()[len(prefix) :])
        found |= {head + f for f in r.hkeys(bucket)}
    return found


def test_a_plain_list_holds_keyed_hashes_never_a_bare_digest(api, listed, redis_server):
    r = redis_server.client(decode_responses=False)
    key = DEFAULT_SUPPRESSION_KEY.encode()
    want = hmac.new(key, bare(PHONE), hashlib.sha256).digest()[:16]
    with db.connection_context():
        stored = {e.digest for e in SuppressionEntry.select().where(SuppressionEntry.list_id == "p-phone")}
    assert stored == {want.hex()}
    assert redis_fields(r, "p-phone") == {want}
    full = hashlib.sha256(PHONE.encode()).digest()
    for digest in (bare(PHONE), full):
        assert digest.hex() not in stored and digest not in redis_fields(r, "p-phone")


def test_a_list_keyed_under_another_key_is_unknown_never_passed(api, listed, reconfigure, buyer_server):
    strict, open_ = listed
    reconfigure(suppression_key="another-key-" + "x" * 32)
    resp = api.post_lead(strict, {"lead_id": "k-1", "phone": "+15125550112"})  # on no list, but nobody can tell
    assert resp.status_code == 503, resp.text
    refused = api.http.post(
        f"{api.base}/v1/admin/suppression-lists/p-phone/entries", json={"add": ["+15125550113"]}, headers=api.admin
    )
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "suppression_key_mismatch")


def test_lists_written_before_are_rehashed_from_the_database(api, app, buyer_server, redis_server):
    """sql/018's plain list (bare digests, no key id) keeps suppressing until and while the
    rehash runs, and afterwards holds keyed hashes only, in the database and in Redis; a second
    run rewrites nothing."""
    buyer_server.add("b")
    store = services.of(app).store
    old = [PHONE, "+15125550222", "+442079460958"]
    with db.connection_context():
        SuppressionList.create(id="legacy", field="phone", hash="none", size=len(old))
        SuppressionEntry.insert_many([{"list_id": "legacy", "digest": bare(v).hex()} for v in old]).execute()
    suppression.rebuild(store, suppression.ListRule(id="legacy", field="phone", hash="none"))
    r = redis_server.client(decode_responses=False)
    assert redis_fields(r, "legacy") == {bare(v) for v in old}
    key = api.put_publisher("pub", suppress=["legacy"])
    api.put_buyer("b", buyer_server.url("b"))
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "l-1", "phone": "001 512 555 0111"}).json()["reason"] == "suppressed"
    stale = services.of(app).catalog.snapshot().suppression["legacy"]  # a process that has not reloaded yet
    assert stale.digest_key is None

    runner = app.test_cli_runner()
    done = runner.invoke(args=["suppression", "rehash"])
    assert done.exit_code == 0, done.output
    assert "legacy: 3 entries rewritten" in done.output
    keyed = {hmac.new(DEFAULT_SUPPRESSION_KEY.encode(), bare(v), hashlib.sha256).digest()[:16] for v in old}
    with db.connection_context():
        row = SuppressionList.get_by_id("legacy")
        stored = {
            bytes.fromhex(e.digest) for e in SuppressionEntry.select().where(SuppressionEntry.list_id == "legacy")
        }
    assert row.digest_key is not None and row.size == 3
    assert stored == keyed and redis_fields(r, "legacy") == keyed
    # the old form's digest is gone: a process still reading it answers "unknown", never a miss
    assert suppression.check(store, [stale], {"phone": PHONE}) == {"legacy": suppression.UNKNOWN}
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "l-2", "phone": "+1 512 555 0111#"}).json()["reason"] == "suppressed"
    assert api.post_lead(key, {"lead_id": "l-3", "phone": "+44 20 7946 0958"}).json()["reason"] == "suppressed"
    assert api.post_lead(key, {"lead_id": "l-4", "phone": "+15125550333"}).json()["status"] == "sold"

    again = runner.invoke(args=["suppression", "rehash", "legacy"])
    assert again.exit_code == 0 and "legacy: 0 entries rewritten" in again.output, again.output
    assert redis_fields(r, "legacy") == keyed
    assert add(api, "legacy", "512-555-0444")["size"] == 4
    assert api.post_lead(key, {"lead_id": "l-5", "phone": "+15125550444"}).json()["reason"] == "suppressed"


def test_entries_added_while_a_rehash_runs_are_all_keyed_and_all_suppress(api, app, redis_server):
    """Admins adding to a plain list while it is rehashed: each add lands before the rewrite
    (and is rewritten) or after it (409, sent again, keyed): none is lost, none stays bare."""
    store = services.of(app).store
    old = [f"+1512556{i:04d}" for i in range(3000)]
    with db.connection_context():
        SuppressionList.create(id="busy", field="phone", hash="none", size=len(old))
        for i in range(0, len(old), 500):
            rows = [{"list_id": "busy", "digest": bare(v).hex()} for v in old[i : i + 500]]
            SuppressionEntry.insert_many(rows).execute()
    suppression.rebuild(store, suppression.ListRule(id="busy", field="phone", hash="none"))
    new = [[f"+1737555{t:02d}{i:02d}" for i in range(15)] for t in range(8)]
    start = threading.Barrier(len(new) + 1)

    def adds(values: list[str]) -> int:
        http, conflicts = api.session(), 0
        start.wait()
        for value in values:
            while True:
                resp = http.post(
                    f"{api.base}/v1/admin/suppression-lists/busy/entries", json={"add": [value]}, headers=api.admin
                )
                if resp.status_code != 409:
                    assert resp.status_code == 200, resp.text
                    break
                conflicts += 1
        return conflicts

    def rehash() -> int:
        start.wait()
        return suppression_rehash.rehash(store, "busy", DEFAULT_SUPPRESSION_KEY.encode())

    with ThreadPoolExecutor(len(new) + 1) as pool:
        running = pool.submit(rehash)
        list(pool.map(adds, new))
        assert running.result() >= len(old)
    added = [v for values in new for v in values]
    keyed = {hmac.new(DEFAULT_SUPPRESSION_KEY.encode(), bare(v), hashlib.sha256).digest()[:16] for v in old + added}
    with db.connection_context():
        row = SuppressionList.get_by_id("busy")
        stored = {bytes.fromhex(e.digest) for e in SuppressionEntry.select().where(SuppressionEntry.list_id == "busy")}
    assert stored == keyed and row.size == len(keyed)
    r = redis_server.client(decode_responses=False)
    assert redis_fields(r, "busy") == keyed  # no bare digest left behind
    rule = suppression.ListRule.from_row(row, DEFAULT_SUPPRESSION_KEY.encode())
    for value in added[::7] + old[::500]:
        assert suppression.check(store, [rule], {"phone": value}) == {"busy": suppression.HIT}, value
