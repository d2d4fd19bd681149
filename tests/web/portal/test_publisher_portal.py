"""The publisher portal (docs/api.md "Portals"), against the real Redis, database and app: a
publisher user's own leads (status, payout, held or payable), statement, pre-ping quota and a
new API key; and isolation: logged in as publisher A, every publisher portal route walked with
publisher B's ids answers 404 or shows nothing of B; together with the buyer portal's test,
every /portal route is walked."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from urllib.parse import urlsplit

import pytest

from tests.web.portal.test_buyer_portal import (
    PASSWORD,
    SAME_SITE,
    WALKED_PORTAL,
    answer,
    invite,
)
from webhooks.caps import leases
from webhooks.leads.accounting import ledger
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Publisher

A_EMAIL, B_EMAIL = "surge-user@example.com", "tide-user@example.com"
A_LEAD, B_LEAD, B_UNSOLD = "surge-lead-1", "tide-secret-lead", "tide-secret-unsold"
B_PRICE = "43.21"  # B's sale: its payout 10% of it, 4.32
MONTH = datetime.now(timezone.utc).strftime("%Y-%m")


def settle(publisher_id: str, lead_id: str, buyer_id: str | None, price: str = "20.00") -> None:
    at = datetime.now(timezone.utc)
    outcome = (
        Outcome(
            status="sold", buyer_id=buyer_id, price=Decimal(price), sold_at=at, lease=leases.Lease(buyer_id, "l", ())
        )
        if buyer_id
        else Outcome(status="unsold")
    )
    rule = PublisherRule(id=publisher_id, active=True, payout_pct=Decimal("10"))
    item = settlement.make_item(
        publisher=rule, lead_id=lead_id, outcome=outcome, payload="{}", received_at=at, request_id=None
    )
    with db.connection_context():
        assert ledger.settle([item]) == 1


def portal_user(app, api, email: str, publisher_id: str) -> None:
    resp = invite(api, {"email": email, "role": "publisher", "publisher_id": publisher_id})
    assert resp.status_code == 201, resp.text
    assert resp.json()["publisher_id"] == publisher_id
    path = urlsplit(resp.json()["setup_url"]).path
    done = app.test_client().post(path, data={"password": PASSWORD, "password_again": PASSWORD}, headers=SAME_SITE)
    assert done.status_code == 303 and done.headers["Location"].startswith("/portal/login")


def logged_in(app, email: str):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = "192.0.2.40"
    resp = client.post("/portal/login", data={"email": email, "password": PASSWORD}, headers=SAME_SITE)
    assert resp.status_code == 303 and resp.headers["Location"] == "/portal/publisher", resp.get_data(True)
    return client


def csrf(client) -> str:
    page = client.get("/portal/publisher")
    assert page.status_code == 200, page.get_data(True)
    return page.get_data(as_text=True).split('name="csrf_token" value="', 1)[1].split('"', 1)[0]


@pytest.fixture
def two_publishers(app, api, buyer_server):
    buyer_server.add("acme")
    api.put_publisher("surge", commission_pct="10")
    api.put_publisher("tide", commission_pct="10")
    api.put_buyer("acme", buyer_server.url("acme"), price="20.00")
    settle("surge", A_LEAD, "acme")
    settle("tide", B_LEAD, "acme", price=B_PRICE)
    settle("tide", B_UNSOLD, None)
    portal_user(app, api, A_EMAIL, "surge")
    portal_user(app, api, B_EMAIL, "tide")


ECHOES = (f'value="{B_LEAD}"', "publisher_id=tide")


def b_free(text: str) -> bool:
    for echo in ECHOES:
        text = text.replace(echo, "")
    return not any(m in text for m in (B_LEAD, B_UNSOLD, B_EMAIL, "tide", "4.32", B_PRICE))


def test_a_publisher_user_sees_its_leads_payouts_statement_and_quota(app, api, two_publishers):
    client = logged_in(app, A_EMAIL)
    home = client.get("/portal/publisher").get_data(as_text=True)
    assert "surge" in home and "Pre-ping quota" in home and b_free(home)
    listed = client.get("/portal/publisher/leads").get_data(as_text=True)
    assert A_LEAD in listed and "2.00 payable (sold)" in listed and b_free(listed)
    assert A_LEAD not in client.get("/portal/publisher/leads?status=unsold").get_data(as_text=True)
    assert client.get("/portal/publisher/leads?status=nope").status_code == 400
    one = client.get(f"/portal/publisher/leads/{A_LEAD}").get_data(as_text=True)
    assert "2.00" in one and "payable" in one
    statement = client.get(f"/portal/publisher/statement?month={MONTH}").get_data(as_text=True)
    assert A_LEAD in statement and b_free(statement)
    lines = client.get(f"/portal/publisher/statement.csv?month={MONTH}").get_data(as_text=True)
    assert A_LEAD in lines and b_free(lines)


def test_the_publishers_api_key_is_rotated_and_shown_once(app, api, two_publishers):
    client = logged_in(app, A_EMAIL)
    resp = client.post("/portal/publisher/key", data={"csrf_token": csrf(client)}, headers=SAME_SITE)
    assert resp.status_code == 200, resp.get_data(True)
    key = resp.get_data(as_text=True).split('id="api-key">', 1)[1].split("<", 1)[0]
    assert key.startswith("pk_")
    with db.connection_context():
        assert Publisher.get_by_id("surge").api_key_hint == key[-4:]
        assert Publisher.get_by_id("tide").api_key_hint != key[-4:]
    assert key not in client.get("/portal/publisher").get_data(as_text=True)
    refused = client.post("/portal/publisher/key", data={"csrf_token": "x"}, headers=SAME_SITE)
    assert refused.status_code == 403


def test_each_portal_is_its_users_only(app, api, two_publishers):
    client = logged_in(app, A_EMAIL)
    assert client.get("/portal/buyer").status_code == 404  # a publisher user has no buyer portal
    assert client.get("/ops").status_code == 303


# The publisher portal's routes, walked below (login and logout: in the buyer portal's walk).
WALKED_PUBLISHER = 6


def test_publisher_a_reaches_nothing_of_publisher_b_through_any_portal_route(app, api, two_publishers):
    client = logged_in(app, A_EMAIL)
    token = csrf(client)
    month = f"month={MONTH}&publisher_id=tide"
    walked = {
        "/portal/publisher": [answer(client.get("/portal/publisher?publisher_id=tide"))],
        "/portal/publisher/key": [
            answer(
                client.post("/portal/publisher/key?publisher_id=tide", data={"csrf_token": token}, headers=SAME_SITE)
            )
        ],
        "/portal/publisher/leads": [
            answer(client.get(f"/portal/publisher/leads?lead_id={B_LEAD}")),
            answer(client.get("/portal/publisher/leads?publisher_id=tide&status=unsold")),
        ],
        "/portal/publisher/leads/<lead_id>": [
            answer(client.get(f"/portal/publisher/leads/{B_LEAD}")),
            answer(client.get(f"/portal/publisher/leads/{B_UNSOLD}")),
        ],
        "/portal/publisher/statement": [answer(client.get(f"/portal/publisher/statement?{month}"))],
        "/portal/publisher/statement.csv": [answer(client.get(f"/portal/publisher/statement.csv?{month}"))],
    }
    every = {r.rule for r in app.url_map.iter_rules() if r.rule.startswith("/portal/publisher")}
    assert set(walked) == every, "not walked: " + ", ".join(sorted(every ^ set(walked)))
    assert len(walked) == WALKED_PUBLISHER
    portal = {r.rule for r in app.url_map.iter_rules() if r.rule.startswith("/portal")}
    assert len(portal) == WALKED_PORTAL + WALKED_PUBLISHER  # no /portal route is left unwalked
    for rule, answers in walked.items():
        for status, body in answers:
            assert b_free(body), (rule, body[:2000])
            expected = (404,) if rule == "/portal/publisher/leads/<lead_id>" else (200,)
            assert status in expected, (rule, status, body[:500])
    with db.connection_context():
        assert Publisher.get_by_id("tide").api_key_hint == "6789"  # B's key (conftest's) is B's still
