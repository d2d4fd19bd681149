"""The buyer portal (docs/api.md "Portals"), against the real Redis, database and app: a buyer
user invited by an operator, set up through its link and logged in on /portal; its own sales
(search, CSV), a return, feedback, its balance, statement and a new API key; and isolation:
logged in as buyer A, every portal route and every /v1/buyer/* route (with A's key) walked with
buyer B's ids answers 404 or shows nothing of B, and an /ops session and a portal session open
nothing of each other."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone
from urllib.parse import urlsplit

import pytest

from tests.web.test_buyer_api import _sold
from webhooks.billing import charges
from webhooks.billing.wallets import Entry
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, Buyer, LeadReturn, Sale

PASSWORD = "correct horse battery staple"
SAME_SITE = {"Sec-Fetch-Site": "same-origin"}
# Buyer B's marks: none of them may appear in any answer to buyer A.
B_LEAD, B_PRICE, B_EMAIL, B_REF = "bolt-secret-lead", "37.77", "bolt-user@example.com", "bolt-secret-topup"
A_LEAD, A_PRICE, A_EMAIL = "acme-lead-1", "20.00", "acme-user@example.com"
MONTH = datetime.now(timezone.utc).strftime("%Y-%m")


def invite(api, body: dict) -> object:
    return api.http.post(f"{api.base}/v1/admin/users", json=body, headers=api.admin)


def portal_user(app, api, email: str, buyer_id: str) -> None:
    """A buyer user of `buyer_id`, invited and set up (no second factor asked)."""
    resp = invite(api, {"email": email, "role": "buyer", "buyer_id": buyer_id})
    assert resp.status_code == 201, resp.text
    assert resp.json()["buyer_id"] == buyer_id and resp.json()["second_factor"] is False
    path = urlsplit(resp.json()["setup_url"]).path
    client = app.test_client()
    page = client.get(path).get_data(as_text=True)
    assert "totp-secret" not in page
    done = client.post(path, data={"password": PASSWORD, "password_again": PASSWORD}, headers=SAME_SITE)
    assert done.status_code == 303 and done.headers["Location"].startswith("/portal/login"), done.get_data(True)


def logged_in(app, email: str, address: str = "192.0.2.20"):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    resp = client.post("/portal/login", data={"email": email, "password": PASSWORD}, headers=SAME_SITE)
    assert resp.status_code == 303 and resp.headers["Location"] == "/portal/buyer", resp.get_data(True)
    assert "floodgate_portal=" in resp.headers["Set-Cookie"] and "Path=/portal" in resp.headers["Set-Cookie"]
    return client


def csrf(client) -> str:
    page = client.get("/portal/buyer")
    assert page.status_code == 200, page.get_data(True)
    return page.get_data(as_text=True).split('name="csrf_token" value="', 1)[1].split('"', 1)[0]


def billed(api, buyer_server, buyer_id: str, account: str) -> None:
    buyer_server.add(buyer_id)
    api.put_buyer(buyer_id, buyer_server.url(buyer_id), price="20.00")
    billing = {"mode": "prepaid", "account": account, "currency": "USD", "low_balance": None}
    with db.connection_context():
        Buyer.update(billing=json.dumps(billing), billing_account=f"{account}|USD").where(
            Buyer.id == buyer_id
        ).execute()


@pytest.fixture
def two_buyers(app, api, buyer_server):
    """Buyers acme (A) and bolt (B) of publisher surge, each billed from its own wallet, each
    with a sale, a top-up and a portal user; B's key too."""
    api.put_publisher("surge", commission_pct="10")
    billed(api, buyer_server, "acme", "buyer-acme")
    billed(api, buyer_server, "bolt", "buyer-bolt")
    _sold(A_LEAD, "acme", price=A_PRICE)
    _sold(B_LEAD, "bolt", price=B_PRICE)
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    with db.atomic():
        charges.move("buyer-acme", "USD", 50000, now, entry=Entry.TOP_UP, reference="acme-topup")
        charges.move("buyer-bolt", "USD", 91234, now, entry=Entry.TOP_UP, reference=B_REF)
    portal_user(app, api, A_EMAIL, "acme")
    portal_user(app, api, B_EMAIL, "bolt")
    resp = api.http.post(f"{api.base}/v1/admin/buyers/bolt/api-key", headers=api.admin)
    assert resp.status_code == 201
    return resp.json()["api_key"]


# The search form and its CSV link give back what A typed (B's lead id, a buyer_id=bolt added to
# the address): A's own words, not B's data; they are taken out before the check.
ECHOES = (f'value="{B_LEAD}"', f"lead_id={B_LEAD}", "buyer_id=bolt")


def b_free(text: str) -> bool:
    for echo in ECHOES:
        text = text.replace(echo, "")
    return not any(mark in text for mark in (B_LEAD, B_PRICE, B_EMAIL, B_REF, "bolt", "912.34"))


def test_a_buyer_user_sees_searches_returns_and_gives_feedback_on_its_own_sales(app, api, two_buyers):
    client = logged_in(app, A_EMAIL)
    resp = client.get("/portal/buyer")
    assert "script-src 'none'" in resp.headers["Content-Security-Policy"]
    assert resp.headers["X-Frame-Options"] == "DENY" and resp.headers["Cache-Control"] == "no-store"
    home = resp.get_data(as_text=True)
    assert "acme" in home and "500.00" in home and "top it up" in home and b_free(home)
    sales = client.get("/portal/buyer/sales").get_data(as_text=True)
    assert A_LEAD in sales and A_PRICE in sales and b_free(sales)
    assert A_LEAD not in client.get("/portal/buyer/sales?lead_id=other").get_data(as_text=True)
    assert A_LEAD in client.get("/portal/buyer/sales?status=sold&since=2000-01-01T00:00:00Z").get_data(True)
    assert A_LEAD not in client.get("/portal/buyer/sales?status=returned").get_data(as_text=True)
    assert client.get("/portal/buyer/sales?status=nope").status_code == 400
    rows = list(csv.reader(io.StringIO(client.get("/portal/buyer/sales.csv").get_data(as_text=True))))
    assert rows[0][0] == "lead_id" and [r[0] for r in rows[1:]] == [A_LEAD] and rows[1][2] == "20.00"

    token = csrf(client)
    fb = client.post(
        f"/portal/buyer/sales/surge/{A_LEAD}/feedback",
        data={"id": "fb-1", "event": "converted", "value": "120.00", "csrf_token": token},
        headers=SAME_SITE,
    )
    assert fb.status_code == 303, fb.get_data(True)
    assert "converted" in client.get(f"/portal/buyer/sales/surge/{A_LEAD}").get_data(as_text=True)
    returned = client.post(
        f"/portal/buyer/sales/surge/{A_LEAD}/return", data={"reason": "bad", "csrf_token": token}, headers=SAME_SITE
    )
    assert returned.status_code == 200, returned.get_data(True)
    with db.connection_context():
        assert Sale.get(Sale.lead_id == A_LEAD).status in ("returned", "return_pending")
        # the portal's user is named, in the audit log and on the return
        assert AuditLog.get(AuditLog.action == "lead.returned").actor == f"user:{A_EMAIL}"
        assert LeadReturn.get(LeadReturn.lead_id == A_LEAD).actor == f"user:{A_EMAIL}"

    statement = client.get(f"/portal/buyer/statement?month={MONTH}").get_data(as_text=True)
    assert "acme-topup" in statement and b_free(statement)
    lines = client.get(f"/portal/buyer/statement.csv?month={MONTH}").get_data(as_text=True)
    assert "acme-topup" in lines and b_free(lines)


def test_a_change_needs_the_csrf_token_and_this_sites_origin(app, api, two_buyers):
    client = logged_in(app, A_EMAIL)
    token = csrf(client)
    path = f"/portal/buyer/sales/surge/{A_LEAD}/return"
    assert client.post(path, data={"csrf_token": "x" * 64}, headers=SAME_SITE).status_code == 403
    assert client.post(path, data={"csrf_token": token}, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    with db.connection_context():
        assert Sale.get(Sale.lead_id == A_LEAD).status == "sold"


def test_the_api_key_is_rotated_and_shown_once(app, api, two_buyers):
    client = logged_in(app, A_EMAIL)
    resp = client.post("/portal/buyer/key", data={"csrf_token": csrf(client)}, headers=SAME_SITE)
    assert resp.status_code == 200
    key = resp.get_data(as_text=True).split('id="api-key">', 1)[1].split("<", 1)[0]
    assert key.startswith("bk_")
    listed = api.http.get(f"{api.base}/v1/buyer/leads", headers={"Authorization": f"Bearer {key}"})
    assert [i["lead_id"] for i in listed.json()["items"]] == [A_LEAD]
    assert key not in client.get("/portal/buyer").get_data(as_text=True)
    bolt = api.http.get(f"{api.base}/v1/buyer/leads", headers={"Authorization": f"Bearer {two_buyers}"})
    assert bolt.status_code == 200  # the other buyer's key still works


def test_the_invitation_names_a_buyer_that_exists(api, two_buyers):
    for body, field in (
        ({"email": "x@example.com", "role": "buyer"}, "buyer_id"),
        ({"email": "x@example.com", "role": "buyer", "buyer_id": "nobody"}, "buyer_id"),
        ({"email": "x@example.com", "role": "publisher", "publisher_id": "nobody"}, "publisher_id"),
        ({"email": "x@example.com", "role": "admin", "buyer_id": "acme"}, "buyer_id"),
        ({"email": "x@example.com", "role": "buyer", "publisher_id": "surge"}, "publisher_id"),
    ):
        resp = invite(api, body)
        error = resp.json()["error"]
        assert resp.status_code == 400 and error["code"] == "invalid_user", (body, resp.text)
        assert error["message"].startswith(f"{field}: "), (body, resp.text)


def test_an_ops_session_opens_no_portal_page_and_a_portal_session_no_ops_page(app, api, two_buyers):
    client = logged_in(app, A_EMAIL)
    session_id = client.get_cookie("floodgate_portal", path="/portal").value
    client.set_cookie("floodgate_ops", session_id, path="/ops")  # the portal's session under /ops' cookie
    ops = client.get("/ops")
    assert ops.status_code == 303 and "/ops/login" in ops.headers["Location"]
    assert client.get("/v1/admin/users", headers={"Cookie": f"floodgate_ops={session_id}"}).status_code == 401
    wrong = client.post("/ops/login", data={"email": A_EMAIL, "password": PASSWORD, "next": "/ops"})
    assert wrong.status_code == 401  # a buyer user's password opens no /ops session

    ops_client = app.test_client()
    ops_client.environ_base["REMOTE_ADDR"] = "192.0.2.30"
    opened = ops_client.post("/ops/login", data={"token": api.admin["Authorization"].split()[1]})
    ops_session = opened.headers["Set-Cookie"].split("floodgate_ops=", 1)[1].split(";", 1)[0]
    ops_client.set_cookie("floodgate_portal", ops_session, path="/portal")
    resp = ops_client.get("/portal/buyer")
    assert resp.status_code == 303 and resp.headers["Location"].startswith("/portal/login")


def answer(resp) -> tuple[int, str]:
    """An answer's status and whole body, read at once (a streamed one too)."""
    if hasattr(resp, "get_data"):
        return resp.status_code, resp.get_data(as_text=True)
    return resp.status_code, resp.text


def walk(client, token: str) -> dict[str, list[tuple[int, str]]]:
    """Every portal route of the buyer but logout asked with buyer B's ids: {rule: answers}."""
    b_sale = f"/portal/buyer/sales/surge/{B_LEAD}"
    form = {"csrf_token": token}
    month = f"month={MONTH}&buyer_id=bolt"
    return {
        "/portal/buyer": [answer(client.get("/portal/buyer?buyer_id=bolt"))],
        "/portal/buyer/sales": [
            answer(client.get(f"/portal/buyer/sales?lead_id={B_LEAD}")),
            answer(client.get("/portal/buyer/sales?buyer_id=bolt")),
        ],
        "/portal/buyer/sales.csv": [answer(client.get(f"/portal/buyer/sales.csv?lead_id={B_LEAD}&buyer_id=bolt"))],
        "/portal/buyer/sales/<publisher_id>/<lead_id>": [answer(client.get(b_sale))],
        "/portal/buyer/sales/<publisher_id>/<lead_id>/return": [
            answer(client.post(b_sale + "/return", data={**form, "reason": "x"}, headers=SAME_SITE))
        ],
        "/portal/buyer/sales/<publisher_id>/<lead_id>/feedback": [
            answer(client.post(b_sale + "/feedback", data={**form, "id": "f", "event": "converted"}, headers=SAME_SITE))
        ],
        "/portal/buyer/statement": [answer(client.get(f"/portal/buyer/statement?{month}"))],
        "/portal/buyer/statement.csv": [answer(client.get(f"/portal/buyer/statement.csv?{month}"))],
        "/portal/buyer/key": [answer(client.post("/portal/buyer/key?buyer_id=bolt", data=form, headers=SAME_SITE))],
        "/portal/login": [answer(client.get("/portal/login?buyer_id=bolt"))],
    }


# The routes that name a sale: B's is 404 there, the answer to a sale that does not exist.
BY_ID = {
    "/portal/buyer/sales/<publisher_id>/<lead_id>",
    "/portal/buyer/sales/<publisher_id>/<lead_id>/return",
    "/portal/buyer/sales/<publisher_id>/<lead_id>/feedback",
    "/v1/buyer/returns",
    "/v1/buyer/feedback",
}
WALKED_PORTAL = 12  # the buyer portal's 9 routes, the start, login and logout
WALKED = WALKED_PORTAL + 3  # and the 3 of /v1/buyer


def test_buyer_a_reaches_nothing_of_buyer_b_through_any_portal_or_buyer_api_route(app, api, two_buyers):
    client = logged_in(app, A_EMAIL)
    token = csrf(client)
    walked = walk(client, token)
    a_key = walked["/portal/buyer/key"][0][1].split('id="api-key">', 1)[1].split("<", 1)[0]
    auth = {"Authorization": f"Bearer {a_key}"}
    b_lead = {"lead_id": B_LEAD, "publisher_id": "surge"}
    walked["/v1/buyer/leads"] = [answer(api.http.get(f"{api.base}/v1/buyer/leads", headers=auth))]
    walked["/v1/buyer/returns"] = [answer(api.http.post(f"{api.base}/v1/buyer/returns", json=b_lead, headers=auth))]
    fb = {**b_lead, "id": "f1", "event": "converted"}
    walked["/v1/buyer/feedback"] = [answer(api.http.post(f"{api.base}/v1/buyer/feedback", json=fb, headers=auth))]
    walked["/portal"] = [answer(client.get("/portal"))]  # the start: to A's own portal
    walked["/portal/logout"] = [
        answer(client.post("/portal/logout", data={"csrf_token": token}, headers=SAME_SITE))
    ]  # last: it ends the session

    prefixes = ("/portal/buyer", "/portal/log", "/v1/buyer")
    every = {r.rule for r in app.url_map.iter_rules() if r.rule.startswith(prefixes) or r.rule == "/portal"}
    assert set(walked) == every, "not walked: " + ", ".join(sorted(every ^ set(walked)))
    assert len(walked) == WALKED
    for rule, answers in walked.items():
        for status, body in answers:
            assert b_free(body), (rule, body[:2000])
            expected = (404,) if rule in BY_ID else (200, 303)
            assert status in expected, (rule, status, body[:500])
    with db.connection_context():  # and nothing of B changed
        assert Sale.get(Sale.lead_id == B_LEAD).status == "sold"
        assert not LeadReturn.select().where(LeadReturn.buyer_id == "bolt").exists()
    bolt = api.http.get(f"{api.base}/v1/buyer/leads", headers={"Authorization": f"Bearer {two_buyers}"})
    assert bolt.status_code == 200 and [i["lead_id"] for i in bolt.json()["items"]] == [B_LEAD]
