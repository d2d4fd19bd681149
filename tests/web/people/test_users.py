"""Operator users (docs/api.md "Operator users"): invited by the admin API, set up once through
their link (argon2id password, TOTP for owner and admin), logged in on /ops with a session of
their own; an analyst reads and changes nothing; the audit log names the user; failed logins
are counted per address and per (account, address), so one address' failures never lock out
the right password from another."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

import pyotp
import pytest
import requests
from argon2 import PasswordHasher
from argon2.exceptions import VerificationError

from testkit.ops import COOKIE
from testkit.servers import WebServer, wait_until
from tests.conftest import ADMIN_TOKEN
from tests.web.test_buyer_api import _sold
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, LeadReturn, Publisher, User
from webhooks.web.logins import ACCOUNT_FAILURES, LOGIN_FAILURES

PASSWORD = "correct horse battery staple"
SAME_SITE = {"Sec-Fetch-Site": "same-origin"}


def client_from(app, address: str):
    """The app's test client, every request of it coming from `address`."""
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return client


def invite(api, email: str, role: str) -> dict:
    resp = api.http.post(f"{api.base}/v1/admin/users", json={"email": email, "role": role}, headers=api.admin)
    assert resp.status_code == 201, resp.text
    return resp.json()


def setup_path(invited: dict) -> str:
    return urlsplit(invited["setup_url"]).path


def stored(email: str) -> User:
    with db.connection_context():
        return User.get(User.email == email)


def set_up(app, invited: dict, password: str = PASSWORD) -> pyotp.TOTP | None:
    """Use the set-up link: the password, and the code of the secret the page shows when the
    role needs one. The user's TOTP (None: an analyst)."""
    client = client_from(app, "192.0.2.1")
    page = client.get(setup_path(invited)).get_data(as_text=True)
    totp = None
    fields = {"password": password, "password_again": password}
    if invited["role"] in ("owner", "admin"):
        secret = page.split('id="totp-secret">', 1)[1].split("<", 1)[0]
        assert "otpauth://totp/" in page
        totp = pyotp.TOTP(secret)
        fields["code"] = totp.now()
    resp = client.post(setup_path(invited), data=fields, headers=SAME_SITE)
    assert resp.status_code == 303 and resp.headers["Location"].startswith("/ops/login"), resp.get_data(as_text=True)
    return totp


def next_code(totp: pyotp.TOTP, steps: int = 1) -> str:
    """A code of a later time step that the one-step clock allowance still takes (a step once
    used is not taken again)."""
    return totp.at(time.time() + steps * totp.interval)


def log_in(client, email: str, password: str, code: str = ""):
    return client.post("/ops/login", data={"email": email, "password": password, "code": code, "next": "/ops"})


def session_of(client, resp) -> str:
    """The session cookie the login set, kept by `client` for /ops."""
    assert resp.status_code == 303, resp.get_data(as_text=True)[:400]
    session_id = SimpleCookie(resp.headers["Set-Cookie"])[COOKIE].value
    client.set_cookie(COOKIE, session_id, path="/ops")
    return session_id


def csrf(client, path: str = "/ops/users") -> str:
    page = client.get(path)
    assert page.status_code == 200
    return page.get_data(as_text=True).split('name="csrf_token" value="', 1)[1].split('"', 1)[0]


def post(client, path: str, fields: dict) -> object:
    return client.post(path, data={**fields, "csrf_token": csrf(client)}, headers=SAME_SITE)


def user_client(app, api, email: str, role: str, address: str = "192.0.2.10"):
    """A client of `address` logged in as a new user of `role`."""
    totp = set_up(app, invite(api, email, role))
    client = client_from(app, address)
    session_of(client, log_in(client, email, PASSWORD, next_code(totp) if totp else ""))
    return client


def test_invite_set_up_and_log_in_with_totp_opens_a_session_of_the_user(app, api):
    invited = invite(api, "Owner@Example.com", "owner")
    assert invited["email"] == "owner@example.com" and invited["set_up"] is False
    assert setup_path(invited).startswith("/ops/setup/")
    token = setup_path(invited).rsplit("/", 1)[1]
    row = stored("owner@example.com")
    assert row.password_hash is None and token not in (row.setup_digest or "") and len(row.setup_digest) == 64
    listed = api.http.get(f"{api.base}/v1/admin/users", headers=api.admin).json()["users"]
    assert [u["email"] for u in listed] == ["owner@example.com"] and "setup_url" not in listed[0]

    # a short password, then a wrong code: refused, the link still works
    client = client_from(app, "192.0.2.1")
    short = client.post(setup_path(invited), data={"password": "short", "password_again": "short"}, headers=SAME_SITE)
    assert short.status_code == 400 and "at least 12" in short.get_data(as_text=True)
    wrong = client.post(
        setup_path(invited),
        data={"password": PASSWORD, "password_again": PASSWORD, "code": "000000"},
        headers=SAME_SITE,
    )
    assert wrong.status_code == 400 and stored("owner@example.com").password_hash is None
    totp = set_up(app, invited)
    assert stored("owner@example.com").password_hash.startswith("$argon2id$")
    assert PASSWORD not in stored("owner@example.com").password_hash

    # used once: refused from now on
    assert client.get(setup_path(invited)).status_code == 404
    again = client.post(
        setup_path(invited),
        data={"password": "another password!", "password_again": "another password!", "code": totp.now()},
        headers=SAME_SITE,
    )
    assert again.status_code == 404 and stored("owner@example.com").password_hash.startswith("$argon2id$")

    browser = client_from(app, "192.0.2.2")
    assert log_in(browser, "owner@example.com", PASSWORD).status_code == 401  # no code: no session
    code = next_code(totp)
    session_id = session_of(browser, log_in(browser, "owner@example.com", PASSWORD, code))
    assert browser.get("/ops").status_code == 200 and browser.get("/ops/users").status_code == 200
    assert log_in(client_from(app, "192.0.2.3"), "owner@example.com", PASSWORD, code).status_code == 401  # taken once

    # the owner invites from the console; logging out ends the session
    made = post(browser, "/ops/users", {"email": "ana@example.com", "role": "analyst"})
    assert made.status_code == 201 and "/ops/setup/" in made.get_data(as_text=True)
    assert post(browser, "/ops/logout", {}).status_code == 303
    assert client_from(app, "192.0.2.4").get("/ops", headers={"Cookie": f"{COOKIE}={session_id}"}).status_code == 303


def test_a_wrong_password_then_the_right_one(app, api):
    set_up(app, invite(api, "ana@example.com", "analyst"))
    client = client_from(app, "192.0.2.20")
    wrong = log_in(client, "ana@example.com", PASSWORD + "x")
    assert wrong.status_code == 401 and "Set-Cookie" not in wrong.headers
    assert log_in(client, "nobody@example.com", PASSWORD).status_code == 401
    session_of(client, log_in(client, "ANA@example.com ", PASSWORD))
    assert client.get("/ops/buyers").status_code == 200


def test_an_analyst_reads_everything_and_changes_nothing(app, api):
    analyst = user_client(app, api, "ana@example.com", "analyst")
    for path in ("/ops", "/ops/buyers", "/ops/publishers", "/ops/leads", "/ops/users", "/ops/audit"):
        page = analyst.get(path)
        assert page.status_code == 200, path
        # the page says so, and offers no change form (the stylesheet hides them; only logout stays)
        assert '<body class="read-only">' in page.get_data(as_text=True), path
        assert "changes nothing" in page.get_data(as_text=True), path
    admin = user_client(app, api, "adm@example.com", "admin")
    assert 'class="read-only"' not in admin.get("/ops/buyers").get_data(as_text=True)
    token = csrf(analyst)
    for path, fields in (
        ("/ops/publishers", {"id": "pub-a", "name": "A"}),
        ("/ops/users", {"email": "x@example.com", "role": "owner"}),
        (f"/ops/users/{stored('ana@example.com').id}/deactivate", {}),
        ("/ops/rq/job/no-such-job/requeue", {}),  # the RQ dashboard too
    ):
        resp = analyst.post(path, data={**fields, "csrf_token": token}, headers=SAME_SITE)
        assert resp.status_code == 403, (path, resp.status_code)
    with db.connection_context():
        assert Publisher.select().count() == 0 and User.select().count() == 2
    assert stored("ana@example.com").active


def test_an_admin_changes_everything_but_users(app, api):
    admin = user_client(app, api, "adm@example.com", "admin")
    assert post(admin, "/ops/publishers", {"id": "pub-a", "name": "A"}).status_code == 201
    assert post(admin, "/ops/users", {"email": "x@example.com", "role": "owner"}).status_code == 403
    with db.connection_context():
        assert not User.select().where(User.email == "x@example.com").exists()


def test_every_audit_row_names_the_user_who_acted_and_the_token_stays_admin(app, api):
    admin = user_client(app, api, "adm@example.com", "admin")
    assert post(admin, "/ops/publishers", {"id": "pub-u", "name": "U"}).status_code == 201
    api.put_publisher("pub-t")  # the admin token
    with db.connection_context():
        actors = {row.entity_id: row.actor for row in AuditLog.select().where(AuditLog.entity == "publisher")}
    assert actors == {"pub-u": "user:adm@example.com", "pub-t": "admin"}
    # a request after the user's names nobody: the next row by the token says "admin" again
    api.put_publisher("pub-t2")
    with db.connection_context():
        assert AuditLog.get(AuditLog.entity_id == "pub-t2").actor == "admin"


def test_failures_from_one_address_never_lock_out_the_right_password_from_another(app, api):
    totp = set_up(app, invite(api, "own@example.com", "owner"))
    attacker, operator = client_from(app, "203.0.113.7"), client_from(app, "198.51.100.2")
    answers = [log_in(attacker, "own@example.com", f"guess {i}", "123456").status_code for i in range(10)]
    assert answers == [401] * ACCOUNT_FAILURES + [429] * (10 - ACCOUNT_FAILURES)
    locked = log_in(attacker, "own@example.com", PASSWORD, next_code(totp))
    assert locked.status_code == 429 and int(locked.headers["Retry-After"]) > 0  # the right one too: no oracle
    session_of(operator, log_in(operator, "own@example.com", PASSWORD, next_code(totp)))
    assert operator.get("/ops").status_code == 200
    # wrong codes count as failures too, and a right password with them opens nothing
    other = client_from(app, "198.51.100.3")
    assert [log_in(other, "own@example.com", PASSWORD, "000000").status_code for _ in range(6)] == [401] * 5 + [429]


def test_an_address_has_a_limit_over_every_account(app, api):
    set_up(app, invite(api, "ana@example.com", "analyst"))
    sprayer = client_from(app, "203.0.113.9")
    answers = [log_in(sprayer, f"u{i}@example.com", "guess").status_code for i in range(LOGIN_FAILURES + 1)]
    assert answers == [401] * LOGIN_FAILURES + [429]
    assert log_in(sprayer, "ana@example.com", PASSWORD).status_code == 429
    # the admin token's tries share the address' counter
    assert sprayer.post("/ops/login", data={"token": ADMIN_TOKEN}).status_code == 429
    session_of(client_from(app, "198.51.100.9"), log_in(client_from(app, "198.51.100.9"), "ana@example.com", PASSWORD))


def test_a_deactivated_user_loses_its_session_and_its_login(app, api):
    analyst = user_client(app, api, "ana@example.com", "analyst")
    user_id = stored("ana@example.com").id
    gone = api.http.delete(f"{api.base}/v1/admin/users/{user_id}", headers=api.admin)
    assert gone.status_code == 200 and gone.json()["active"] is False
    assert analyst.get("/ops").status_code == 303
    assert log_in(client_from(app, "192.0.2.30"), "ana@example.com", PASSWORD).status_code == 401
    assert api.http.get(f"{api.base}/v1/admin/users/{user_id}", headers=api.admin).json()["active"] is False


@pytest.mark.parametrize(
    "body",
    [
        {"email": "not-an-address", "role": "owner"},
        {"email": "a@example.com", "role": "root"},
        {"email": "a@example.com"},
    ],
)
def test_an_invitation_names_an_address_and_a_known_role(api, body):
    resp = api.http.post(f"{api.base}/v1/admin/users", json=body, headers=api.admin)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_user"


def test_users_are_managed_with_the_admin_token_only(api):
    assert (
        api.http.post(f"{api.base}/v1/admin/users", json={"email": "a@example.com", "role": "owner"}).status_code == 401
    )
    invite(api, "a@example.com", "owner")
    dup = api.http.post(
        f"{api.base}/v1/admin/users", json={"email": "A@example.com", "role": "admin"}, headers=api.admin
    )
    assert dup.status_code == 409


def test_a_set_up_link_used_by_many_at_once_works_once(app, api):
    """The set-up link is its own key: of many set-ups at once, each with its own password,
    one sets the password and the others are refused (the invariant, not an order)."""
    invited = invite(api, "ana@example.com", "analyst")
    passwords = [f"password number {i:02d}" for i in range(8)]
    barrier = threading.Barrier(len(passwords))

    def use(password: str) -> int:
        client = client_from(app, "192.0.2.40")
        barrier.wait()
        fields = {"password": password, "password_again": password}
        return client.post(setup_path(invited), data=fields, headers=SAME_SITE).status_code

    with ThreadPoolExecutor(len(passwords)) as pool:
        answers = list(pool.map(use, passwords))
    assert sorted(answers) == [303] + [404] * (len(passwords) - 1), answers
    winner = passwords[answers.index(303)]
    hashed = stored("ana@example.com").password_hash
    assert [p for p in passwords if _verifies(hashed, p)] == [winner]


def _verifies(hashed: str, password: str) -> bool:
    try:
        return PasswordHasher().verify(hashed, password)
    except VerificationError:
        return False


# -- against gunicorn (gevent, two workers): requests of several users at once -----------------


def _browser_of(web, api_admin: dict, email: str, role: str) -> requests.Session:
    """A requests session of `web`, logged in as a new user of `role` (set up through its link)."""
    made = requests.post(
        f"{web.url}/v1/admin/users", json={"email": email, "role": role}, headers=api_admin, timeout=10
    )
    assert made.status_code == 201, made.text
    link = web.url + setup_path(made.json())
    secret = requests.get(link, timeout=10).text.split('id="totp-secret">', 1)[1].split("<", 1)[0]
    totp = pyotp.TOTP(secret)
    fields = {"password": PASSWORD, "password_again": PASSWORD, "code": totp.now()}
    assert requests.post(link, data=fields, headers=SAME_SITE, allow_redirects=False, timeout=10).status_code == 303
    browser = requests.Session()
    fields = {"email": email, "password": PASSWORD, "code": next_code(totp), "next": "/ops"}
    assert browser.post(f"{web.url}/ops/login", data=fields, allow_redirects=False, timeout=10).status_code == 303
    return browser


def test_requests_of_several_users_at_once_are_each_audited_under_their_own_name(web, api):
    """Each request names its own user in the audit log, whatever else the same worker
    process serves at the same time (gevent: many requests per process at once)."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    browsers = {"one@example.com": _browser_of(web, admin, "one@example.com", "admin")}
    browsers["two@example.com"] = _browser_of(web, admin, "two@example.com", "owner")
    tokens = {email: csrf_of(web, browser) for email, browser in browsers.items()}

    def send(n: int) -> requests.Response:
        actor = ("one@example.com", "two@example.com", None)[n % 3]
        publisher_id = f"pub-{n}"
        if actor is None:
            body = {"name": "P", "api_key": f"pk_test_{publisher_id}_0123456789"}
            return requests.put(f"{web.url}/v1/admin/publishers/{publisher_id}", json=body, headers=admin, timeout=30)
        fields = {"id": publisher_id, "name": "P", "csrf_token": tokens[actor]}
        headers = {"Origin": web.url, **SAME_SITE}
        return browsers[actor].post(f"{web.url}/ops/publishers", data=fields, headers=headers, timeout=30)

    def create(n: int) -> tuple[str, int]:
        # sent once: publishers created at once may deadlock in MariaDB, and the loser is run
        # again by the server (publisher_service.save), never answered 503
        return f"pub-{n}", send(n).status_code

    with ThreadPoolExecutor(12) as pool:
        answers = dict(pool.map(create, range(36)))
    assert set(answers.values()) <= {200, 201}, [(p, s) for p, s in answers.items() if s not in (200, 201)]
    with db.connection_context():
        actors = {r.entity_id: r.actor for r in AuditLog.select().where(AuditLog.action == "publisher.put")}
    expected = {f"pub-{n}": ("user:one@example.com", "user:two@example.com", "admin")[n % 3] for n in range(36)}
    assert actors == expected


def csrf_of(web, browser: requests.Session) -> str:
    page = browser.get(f"{web.url}/ops/users", timeout=10)
    assert page.status_code == 200
    return page.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]


@pytest.mark.e2e  # a gunicorn of its own, with an access log
def test_a_set_up_link_never_reaches_the_access_log(base_env, tmp_path):
    log = tmp_path / "access.log"
    server = WebServer({**base_env, "ACCESS_LOG": str(log)}, tmp_path / "web.log", workers=1)
    try:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        made = requests.post(
            f"{server.url}/v1/admin/users",
            json={"email": "ana@example.com", "role": "analyst"},
            headers=admin,
            timeout=10,
        )
        assert made.status_code == 201, made.text
        link = server.url + setup_path(made.json())
        token = link.rsplit("/", 1)[1]
        assert requests.get(link, timeout=10).status_code == 200
        fields = {"password": PASSWORD, "password_again": PASSWORD}
        assert requests.post(link, data=fields, headers=SAME_SITE, allow_redirects=False, timeout=10).status_code == 303
        wait_until(lambda: log.exists() and log.read_text().count("/ops/setup/") >= 2, what="the access log lines")
        text = log.read_text()
        assert '"GET /ops/setup/- HTTP/1.1" 200' in text and '"POST /ops/setup/- HTTP/1.1" 303' in text
        assert token not in text
    finally:
        server.stop()


BROWSER_ACCEPT = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", **SAME_SITE}


def test_a_refused_change_is_a_page_for_a_browser_and_json_for_a_client(app, api):
    analyst = user_client(app, api, "ana@example.com", "analyst")
    fields = {"id": "pub-a", "name": "A", "csrf_token": csrf(analyst)}
    page = analyst.post("/ops/publishers", data=fields, headers=BROWSER_ACCEPT)
    assert page.status_code == 403 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    assert "<h1>Not allowed</h1>" in html and "an analyst reads and changes nothing" in html and 'href="/ops"' in html
    client = analyst.post("/ops/publishers", data=fields, headers=SAME_SITE)
    assert client.status_code == 403 and client.get_json()["error"]["code"] == "read_only_role"


def test_the_users_page_offers_invite_and_deactivate_to_an_owner_only(app, api):
    admin = user_client(app, api, "adm@example.com", "admin")
    html = admin.get("/ops/users").get_data(as_text=True)
    assert 'id="invite"' not in html and "Deactivate" not in html and "Only an owner" in html
    owner = user_client(app, api, "own@example.com", "owner", address="192.0.2.11")
    html = owner.get("/ops/users").get_data(as_text=True)
    assert 'id="invite"' in html and "Deactivate" in html


def test_the_last_owner_who_can_log_in_cannot_be_deactivated(app, api):
    owner = user_client(app, api, "own@example.com", "owner")
    first = stored("own@example.com").id
    refused = api.http.delete(f"{api.base}/v1/admin/users/{first}", headers=api.admin)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "last_owner"
    page = post(owner, f"/ops/users/{first}/deactivate", {})
    assert page.status_code == 409 and "last active owner" in page.get_data(as_text=True)
    # an owner invited but not set up is no owner yet: it may go, and does not count
    pending = invite(api, "later@example.com", "owner")
    assert post(owner, f"/ops/users/{pending['id']}/deactivate", {}).status_code == 303
    assert api.http.delete(f"{api.base}/v1/admin/users/{first}", headers=api.admin).status_code == 409
    # with a second owner set up, either may go, but not both
    second = user_client(app, api, "two@example.com", "owner", address="192.0.2.11")
    assert post(second, f"/ops/users/{first}/deactivate", {}).status_code == 303
    assert not stored("own@example.com").active
    last = stored("two@example.com").id
    assert api.http.delete(f"{api.base}/v1/admin/users/{last}", headers=api.admin).status_code == 409
    assert stored("two@example.com").active


def test_owners_deactivated_all_at_once_leave_one(web, api):
    """Against gunicorn, every owner deactivated at once: the owners' rows are locked, so the
    deactivations go one after another and the last finds its owner the last one."""
    ids = []
    hashed = PasswordHasher().hash(PASSWORD)
    for i in range(6):
        email = f"owner{i}@example.com"
        resp = requests.post(f"{web.url}/v1/admin/users", json={"email": email, "role": "owner"}, headers=api.admin)
        assert resp.status_code == 201, resp.text
        ids.append(resp.json()["id"])
        with db.connection_context():  # set up, as its link would
            User.update(password_hash=hashed, setup_digest=None).where(User.email == email).execute()
    start = threading.Barrier(len(ids))

    def deactivate(user_id: int) -> int:
        start.wait()
        headers = {**api.admin, "Connection": "close"}
        return requests.delete(f"{web.url}/v1/admin/users/{user_id}", headers=headers, timeout=30).status_code

    with ThreadPoolExecutor(len(ids)) as pool:
        answers = sorted(pool.map(deactivate, ids))
    assert answers == [200] * (len(ids) - 1) + [409], answers
    with db.connection_context():
        assert User.select().where(User.active == True).count() == 1  # noqa: E712


def test_a_return_made_on_the_console_names_its_user(app, api, buyer_server):
    buyer_server.add("acme")
    api.put_buyer("acme", buyer_server.url("acme"))
    _sold("lead-r1", "acme")
    admin = user_client(app, api, "adm@example.com", "admin")
    made = post(admin, "/ops/leads/lead-r1/return?publisher_id=surge", {"reason": "bad number"})
    assert made.status_code == 303, made.get_data(as_text=True)[:300]
    with db.connection_context():
        assert LeadReturn.get(LeadReturn.lead_id == "lead-r1").actor == "user:adm@example.com"
        assert AuditLog.get(AuditLog.action == "lead.returned").actor == "user:adm@example.com"


def test_the_users_page_invites_a_portal_user_tied_to_its_buyer(app, api, buyer_server):
    buyer_server.add("acme")
    api.put_buyer("acme", buyer_server.url("acme"))
    owner = user_client(app, api, "own@example.com", "owner")
    page = owner.get("/ops/users").get_data(as_text=True)
    assert '<option value="acme">buyer</option>' in page  # the pick-list
    made = post(owner, "/ops/users", {"email": "desk@acme.example", "role": "buyer", "tenant": "acme"})
    assert made.status_code == 201 and "/ops/setup/" in made.get_data(as_text=True)
    assert stored("desk@acme.example").buyer_id == "acme"
    for fields, problem in (
        ({"email": "a@example.com", "role": "analyst", "tenant": "acme"}, "only a buyer or publisher user"),
        ({"email": "b@example.com", "role": "buyer", "tenant": ""}, "buyer_id: required"),
        ({"email": "c@example.com", "role": "publisher", "tenant": "acme"}, "no publisher"),
    ):
        refused = post(owner, "/ops/users", fields)
        assert refused.status_code == 400 and problem in refused.get_data(as_text=True), fields
    with db.connection_context():
        assert User.select().count() == 2
