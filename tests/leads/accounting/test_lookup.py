"""A lead's lookup digests (leads/accounting/lookup.py, sql/030): its e-mail and phone as their
consumer keys, keyed, written with the lead, emptied with its body by the purge, and written for
leads settled before them by `leads index`."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

from webhooks.leads.accounting import ledger, lookup
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead

PUB = PublisherRule(id="pub-k", active=True, payout_pct=Decimal("10"))
OLD = datetime.now(timezone.utc) - timedelta(days=400)


def _settle(lead_id: str, body: str, *, key: bytes = lookup.DEFAULT_KEY) -> Lead:
    item = settlement.make_item(
        publisher=PUB, lead_id=lead_id, outcome=Outcome(attempts=[]), payload=body, received_at=OLD, request_id=None
    )
    with db.connection_context():
        ledger.settle([item], lookup_key=key)
        return Lead.get(Lead.lead_id == lead_id)


def test_the_digests_are_of_the_normalised_value_and_of_the_key():
    assert lookup.digests('{"email": " Ada@Example.COM ", "phone": "512.555.0100"}', b"k") == {
        "email_digest": lookup.digest(b"k", "ada@example.com"),
        "phone_digest": lookup.digest(b"k", "+15125550100"),
    }
    assert lookup.digest(b"k", "ada@example.com") != lookup.digest(b"other", "ada@example.com")
    assert lookup.digests('{"email": "no address", "phone": 5125550100}', b"k") == {
        "email_digest": None,
        "phone_digest": None,
    }
    assert lookup.digests("", b"k") == lookup.digests("not json", b"k") == lookup.digests("[1]", b"k")


def test_the_ledger_writes_them_under_the_key_it_is_given(database_url):
    row = _settle("k-1", '{"email": "ada@example.com"}', key=b"a-production-key-of-32-characters!")
    assert row.email_digest == lookup.digest(b"a-production-key-of-32-characters!", "ada@example.com")
    assert row.phone_digest is None


def test_the_purge_empties_them_with_the_body(database_url):
    _settle("k-old", '{"email": "old@example.com", "phone": "+15125550111"}')
    with db.connection_context():
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        emptied, _mark = ledger.purge_chunk(ledger.SHORT_KEPT, now, None, 50)
        row = Lead.get(Lead.lead_id == "k-old")
    assert emptied == 1 and (row.payload, row.email_digest, row.phone_digest) == ("", None, None)


def test_leads_index_writes_the_digests_of_leads_settled_before_them(app):
    for n in range(5):
        _settle(f"k-{n}", '{"email": "k%d@example.com", "phone": "+1512555012%d"}' % (n, n))
    _settle("k-none", '{"name": "no consumer"}')
    with db.connection_context():  # as sql/030 finds them: no digests yet; one body purged since
        Lead.update(email_digest=None, phone_digest=None).execute()
        Lead.update(payload="").where(Lead.lead_id == "k-4").execute()
    result = app.test_cli_runner().invoke(args=["leads", "index", "--chunk", "2"])
    assert result.exit_code == 0, result.output
    assert "4 leads indexed" in result.output
    with db.connection_context():
        rows = {row.lead_id: row for row in Lead.select()}
    for n in range(4):
        assert rows[f"k-{n}"].email_digest == lookup.digest(lookup.DEFAULT_KEY, f"k{n}@example.com")
        assert rows[f"k-{n}"].phone_digest == lookup.digest(lookup.DEFAULT_KEY, f"+1512555012{n}")
    assert rows["k-4"].email_digest is None and rows["k-none"].email_digest is None
    again = app.test_cli_runner().invoke(args=["leads", "index"])
    assert again.exit_code == 0 and "0 leads indexed" in again.output


def test_a_lead_purged_while_its_chunk_is_indexed_keeps_no_digest(database_url, monkeypatch):
    """The chunk's bodies are read before its updates: a purge (or an erasure) landing between
    the two leaves the lead's digests empty, not written from the body read before it."""
    _settle("k-race", '{"email": "race@example.com", "phone": "+15125550199"}')
    with db.connection_context():
        Lead.update(email_digest=None, phone_digest=None).execute()
    read = lookup.digests

    def purged_meanwhile(payload: str, key: bytes) -> dict[str, str | None]:
        found = read(payload, key)
        with db.connection_context():  # the retention purge, landing between the read and the write
            Lead.update(payload="").where(Lead.lead_id == "k-race").execute()
        return found

    monkeypatch.setattr(lookup, "digests", purged_meanwhile)
    with db.connection_context():
        written, _last = lookup.backfill_chunk(lookup.DEFAULT_KEY, 0, 10)
        row = Lead.get(Lead.lead_id == "k-race")
    assert written == 0 and (row.payload, row.email_digest, row.phone_digest) == ("", None, None)
