"""The leads flagged for review (an attempt whose outcome is `unknown`), as the /ops page and
`floodgate leads flagged` read them every few seconds: found on the outcome's index and joined
to their leads by the unique key, so what a read costs does not grow with the ledger."""

from __future__ import annotations

from datetime import timedelta

import pytest

from testkit.reads import rows_read
from webhooks.leads.accounting.ledger import flagged
from webhooks.storage.records.db import db, is_mysql
from webhooks.storage.records.models import Lead, LeadAttempt, utcnow

LEADS = 3000


@pytest.fixture
def ledger(database_url):
    """LEADS leads of publisher `fl-pub`, each with one accepted attempt; every 1000th also has
    an `unknown` one (3 flagged leads)."""
    if not is_mysql():
        pytest.skip("needs MySQL/MariaDB (none reachable on 127.0.0.1:3306): counts the rows the server reads")
    now = utcnow()
    leads = [
        dict(publisher_id="fl-pub", lead_id=f"fl-{i}", status="unsold", payload="{}",
             received_at=now - timedelta(seconds=i))
        for i in range(LEADS)
    ]  # fmt: skip
    attempts = [
        dict(publisher_id="fl-pub", lead_id=f"fl-{i}", seq=1, buyer_id="acme", outcome="rejected", ms=20)
        for i in range(LEADS)
    ] + [
        dict(publisher_id="fl-pub", lead_id=f"fl-{i}", seq=2, buyer_id="acme", outcome="unknown", ms=2000)
        for i in range(0, LEADS, 1000)
    ]  # fmt: skip
    with db.connection_context():
        for rows, model in ((leads, Lead), (attempts, LeadAttempt)):
            for i in range(0, len(rows), 500):
                model.insert_many(rows[i : i + 500]).execute()
    yield
    with db.connection_context():
        LeadAttempt.delete().where(LeadAttempt.publisher_id == "fl-pub").execute()
        Lead.delete().where(Lead.publisher_id == "fl-pub").execute()


def test_the_flagged_leads_are_read_without_scanning_the_ledger(ledger):
    with db.connection_context():
        found: list[Lead] = []
        assert rows_read(lambda: found.extend(flagged(50))) < 100  # the whole ledger when scanned
        assert [lead.lead_id for lead in found if lead.publisher_id == "fl-pub"] == ["fl-0", "fl-1000", "fl-2000"]
        assert [lead.lead_id for lead in flagged(2)] == ["fl-0", "fl-1000"]  # newest first, limited
