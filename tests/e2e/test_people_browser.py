"""Operator users and both portals driven as people drive them, in a real headless Chromium
against gunicorn, the RQ worker, Redis and the database (docs/api.md "Operator users",
"Portals"). An owner is invited with the admin token, sets up its login (a refused password and
code first) and logs in with its TOTP code (a wrong one first); it invites an admin and an
analyst, who do the same. Each role's allowed and refused changes; failed logins lock an account
out of one address only. A buyer user and a publisher user each set up their login and use
their portal: search, CSV, a return, feedback, balance, statement, a new API key. Every form is
sent with its optional fields left empty.

Screenshots of every page land in $FG_SCREENSHOTS when set (scripts/screenshots writes
docs/screenshots/ so, numbered after the console's), else in the test's tmp_path."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pyotp
import pytest
import requests

from testkit.browser import Page
from testkit.payments import deliver, encode, payload, without_payer
from testkit.servers import BuyerServer, wait_until
from tests.conftest import Api
from tests.e2e.conftest import log_in, page_errors
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog
from webhooks.web.logins import ACCOUNT_FAILURES

pytestmark = pytest.mark.e2e

PNG = b"\x89PNG\r\n\x1a\n"
MAX_SHOT = 300_000  # bytes: docs/screenshots stays small
PASSWORD = "correct horse battery staple"
OWNER, ADMIN, ANALYST = "owner@example.com", "admin@example.com", "analyst@example.com"
BUYER, PUBLISHER = "acme-portal", "surge-portal"
BUYER_USER, PUBLISHER_USER = "buyer@acme.example", "desk@surge.example"
WALLET = "buyer-acme-portal"
OTHER_ADDRESS = "127.0.0.2"  # the whole of 127/8 is this host's: a second client address


@dataclass
class Person:
    """The browser's tab as a person uses it, the admin API beside it, the screenshots taken."""

    page: Page
    api: Api
    shots_dir: Path
    shots: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return self.api.base + path

    def path(self) -> str:
        return self.page.url.removeprefix(self.api.base)

    def goto(self, path: str, status: int = 200) -> None:
        assert self.page.goto(path if "://" in path else self.url(path)) == status, (path, self.page.status)
        self.answered(status)

    def submit(self, css: str, status: int) -> None:
        """Submit the form (or click the button) `css`; the page that loads is answered `status`."""
        assert self.page.submit(css) == status, (css, self.page.status, self.page.url, self.body()[:300])
        self.answered(status)

    def answered(self, status: int) -> None:
        """A 4xx document is logged by Chromium as a failed load, which is no page error: that
        line is taken off the page's errors; any other error fails the test."""
        if status >= 400:
            logged = f"the server responded with a status of {status} "
            mine = [e for e in self.page.console_errors if logged in e]
            assert mine, self.page.console_errors
            for line in mine:
                self.page.console_errors.remove(line)
        assert page_errors(self.page) == [], (self.page.url, page_errors(self.page))

    def fill(self, values: dict[str, str]) -> None:
        for css, value in values.items():
            self.page.fill(css, value)

    def body(self) -> str:
        return self.page.text("body") or ""

    def alert(self) -> str:
        return " ".join(t.strip() for t in self.page.texts("[role=alert]"))

    def status_text(self) -> str:
        return " ".join(t.strip() for t in self.page.texts("[role=status]"))

    def shot(self, name: str) -> None:
        """The page as it stands, as <name>.png (NN-what); no console error on it so far."""
        assert page_errors(self.page) == [], (self.page.url, page_errors(self.page))
        path = self.page.screenshot(self.shots_dir / f"{name}.png")
        data = path.read_bytes()
        assert data[:8] == PNG and int.from_bytes(data[16:20], "big") == 1280, path
        if len(data) > MAX_SHOT:  # a tall page: its first screen only
            self.page.screenshot(path, full_page=False)
            assert path.read_bytes()[:8] == PNG and path.stat().st_size <= MAX_SHOT, path
        self.shots.append(path.name)

    def cookies(self) -> dict[str, str]:
        """The browser's cookies for the site, httpOnly ones included (as a download sends them)."""
        found = self.page.send("Network.getCookies", {"urls": [self.url("/ops"), self.url("/portal/")]})
        return {c["name"]: c["value"] for c in found["cookies"] if urlsplit(self.url("/")).hostname == c["domain"]}

    def download(self, link_css: str) -> str:
        """The file the link `link_css` downloads, fetched with the browser's own cookies."""
        href = self.page.attr(link_css, "href")
        assert href, link_css
        resp = requests.get(self.url(href), cookies=self.cookies(), timeout=30, headers={"Connection": "close"})
        assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/csv"), resp.text[:300]
        assert resp.headers["Content-Disposition"].startswith("attachment;")
        return resp.text

    def post_from_page(self, action: str) -> None:
        """What a hand-made form on this page would post to `action` (with the page's CSRF
        token): there is no button for it, but nothing stops a person from crafting one."""
        self.page.evaluate(
            "(() => { const f = document.createElement('form'); f.method = 'post';"
            f" f.action = {json.dumps(action)};"
            " const t = document.createElement('input'); t.type = 'hidden'; t.name = 'csrf_token';"
            " t.value = document.querySelector('input[name=csrf_token]').value; f.appendChild(t);"
            " f.id = 'hand-made'; document.body.appendChild(f); })()"
        )


@dataclass
class Authenticator:
    """A person's authenticator app: the code of a time step not used yet (the server takes
    each step once, and the one either side of now)."""

    secret: str
    used: set[int] = field(default_factory=set)

    def code(self, use: bool = True) -> str:
        totp = pyotp.TOTP(self.secret)
        while True:
            now = time.time()
            step = int(now) // totp.interval
            late = now % totp.interval > totp.interval - 5  # the step before may expire in flight
            for candidate in (step, step + 1) if late else (step, step + 1, step - 1):
                if candidate not in self.used:
                    if use:
                        self.used.add(candidate)
                    return str(totp.at(candidate * totp.interval))
            wait_until(lambda s=step: int(time.time()) // totp.interval != s, timeout=35, what="the next TOTP step")


class Relay:
    """A TCP relay listening on OTHER_ADDRESS whose connections to the web server leave from
    OTHER_ADDRESS: a browser opening it is another client address to the server (and another
    host to the browser, with cookies of its own)."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.server = socket.create_server((OTHER_ADDRESS, 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = [self.server]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def base(self) -> str:
        return f"http://{OTHER_ADDRESS}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(
                ("127.0.0.1", self.target_port), timeout=30, source_address=(OTHER_ADDRESS, 0)
            )
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        for s in self.sockets:
            s.close()


@pytest.fixture
def shots_dir(tmp_path: Path) -> Path:
    where = Path(os.environ.get("FG_SCREENSHOTS") or tmp_path).resolve()
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
def relay(web_api: Api) -> Iterator[Relay]:
    made = Relay(urlsplit(web_api.base).port or 80)
    yield made
    made.close()


# -- operator users


def invite_on_page(p: Person, email: str, role: str) -> str:
    """Invite from the users page; the set-up link it shows once."""
    p.goto("/ops/users")
    p.fill({"#email": email, "#role": role})
    p.submit("#invite button[type=submit]", 201)
    assert email in (p.page.text("#invited") or "")
    link = (p.page.text("#setup-link") or "").strip()
    assert link.startswith(p.url("/ops/setup/")), link
    return link


def set_up(p: Person, link: str, *, totp: bool, shot: str | None = None) -> Authenticator | None:
    """Open the set-up link; a password too short, then two that differ, then, with a second
    factor, a wrong code: each refused, the page saying why; then all right: the login form
    says the login is set up."""
    p.goto(link)
    assert p.page.text("h1") == "Set up your login"
    secret = (p.page.text("#totp-secret") or "").strip() if totp else None
    if totp:
        assert secret and f"secret={secret}" in (p.page.text("#totp-uri") or "")
    else:
        assert p.page.text("#code") is None and p.page.text("#totp-secret") is None
    if shot:
        p.shot(shot)
    if totp:
        p.fill({"#code": "000000"})
    p.fill({"#password": "short", "#password_again": "short"})  # typed, the browser's minlength stops it
    p.submit("#setup button[type=submit]", 400)
    assert "at least 12 characters" in p.alert()
    p.fill({"#password": PASSWORD, "#password_again": PASSWORD + "!", **({"#code": "000000"} if totp else {})})
    p.submit("#setup button[type=submit]", 400)
    assert "differ" in p.alert()
    assert p.page.attr("#password", "value") in (None, "")  # a password is never sent back
    app = Authenticator(secret) if secret else None
    if app is not None:
        assert (p.page.text("#totp-secret") or "").strip() == secret  # the same secret, still to confirm
        p.fill({"#password": PASSWORD, "#password_again": PASSWORD, "#code": "000000"})
        p.submit("#setup button[type=submit]", 400)
        assert "not the current one" in p.alert()
        p.fill({"#code": app.code()})
    p.fill({"#password": PASSWORD, "#password_again": PASSWORD})
    p.submit("#setup button[type=submit]", 200)
    return app


def user_log_in(p: Person, email: str, app: Authenticator | None, status: int = 200, base: str = "") -> None:
    """The user's form of /ops/login (the code left empty without a second factor)."""
    p.goto((base or p.api.base) + "/ops/login")
    p.fill({"#email": email, "#password": PASSWORD, "#code": app.code() if app else ""})
    p.submit("#user-login button[type=submit]", status)


def log_out(p: Person) -> None:
    p.submit("nav.top form.end button", 200)
    assert p.path() == "/ops/logged-out"


def test_an_owner_an_admin_and_an_analyst_each_do_what_their_role_allows(
    web_api: Api, buyer_server: BuyerServer, page: Page, shots_dir: Path, relay: Relay
) -> None:
    p = Person(page, web_api, shots_dir)
    buyer_server.add(BUYER)
    web_api.put_buyer(BUYER, buyer_server.url(BUYER))

    # the first owner: invited with the admin token (the console's users page, or the API)
    log_in(page, web_api.base, "/ops/users")
    assert p.page.text("#users tbody td") == "No users yet."
    owner_link = invite_on_page(p, OWNER, "owner")
    p.shot("16-users-invited")
    log_out(p)

    owner_app = set_up(p, owner_link, totp=True, shot="17-setup")
    assert p.path() == "/ops/login?notice=set_up" and "set up" in p.status_text()
    p.goto(owner_link, 404)  # used once
    # a wrong code, then the right one
    p.goto("/ops/login")
    p.fill({"#email": OWNER, "#password": PASSWORD, "#code": "123456"})
    p.submit("#user-login button[type=submit]", 401)
    assert "Wrong e-mail, password or code." in p.alert()
    p.shot("18-login-wrong-code")
    assert owner_app is not None
    user_log_in(p, OWNER, owner_app)
    assert p.path() == "/ops"

    admin_link = invite_on_page(p, ADMIN, "admin")
    analyst_link = invite_on_page(p, ANALYST, "analyst")
    p.goto("/ops/users")
    users = p.page.attrs("#users tbody tr", "data-user")
    states = zip(*(p.page.attrs("#users tbody tr", a) for a in ("data-role", "data-set-up", "data-active")))
    assert dict(zip(users, states)) == {
        OWNER: ("owner", "true", "true"),
        ADMIN: ("admin", "false", "true"),
        ANALYST: ("analyst", "false", "true"),
    }
    audit = list(
        zip(p.page.texts("table.audit tbody td:nth-child(2)"), p.page.attrs("table.audit tbody tr", "data-action"))
    )
    owner = "user:" + OWNER
    assert audit == [(owner, "user.invite"), (owner, "user.invite"), (owner, "user.setup"), ("admin", "user.invite")]
    p.shot("19-users")
    log_out(p)

    # the admin: sets up with a second factor, changes a buyer, manages no user
    admin_app = set_up(p, admin_link, totp=True)
    assert admin_app is not None
    user_log_in(p, ADMIN, admin_app)
    p.goto(f"/ops/buyers/{BUYER}")
    p.submit("#buyer-state button", 200)
    assert p.page.attr("#buyer-state", "data-active") == "false"
    assert web_api.get(f"/v1/admin/buyers/{BUYER}").json()["active"] is False
    with db.connection_context():
        paused = AuditLog.select().where(AuditLog.entity == "buyer").order_by(AuditLog.id.desc()).first()
    assert (paused.action, paused.actor) == ("buyer.update", "user:admin@example.com")
    p.goto("/ops/users")
    assert p.page.text("#invite") is None and p.page.texts("#users button") == []  # no change offered
    assert "Only an owner" in p.body()
    p.post_from_page("/ops/users")
    p.submit("#hand-made", 403)
    assert p.page.text("h1") == "Not allowed" and "only an owner manages users" in p.alert()
    assert p.page.attr("[data-error-code]", "data-error-code") == "owner_only"
    p.shot("20-admin-refused")
    p.submit("a[href='/ops']", 200)  # the way back
    log_out(p)

    # the analyst: no second factor; reads every page; every change is refused
    assert set_up(p, analyst_link, totp=False) is None
    user_log_in(p, ANALYST, None)
    pages = [h for h in p.page.attrs("nav.top a", "href") if h and not h.startswith("/ops/rq")]
    assert "/ops/users" in pages and len(pages) >= 10, pages
    for path in pages:
        p.goto(path)
    p.goto(f"/ops/buyers/{BUYER}")
    assert "changes nothing" in (p.page.text(".read-only-note") or "")
    hidden = "[...document.querySelectorAll('form[method=post]:not(.keep)')].every(f => f.offsetParent === null)"
    assert p.page.evaluate(hidden) is True  # no change form offered
    p.submit("#buyer-state form", 403)  # Resume, sent all the same (as a crafted request would be)
    assert p.page.text("h1") == "Not allowed" and "an analyst reads and changes nothing" in p.alert()
    p.shot("21-analyst-refused")
    p.submit("a[href='/ops']", 200)
    assert web_api.get(f"/v1/admin/buyers/{BUYER}").json()["active"] is False  # unchanged
    p.goto("/ops/users")
    assert p.page.text("#invite") is None
    log_out(p)

    # wrong passwords lock the admin's account out of this address only
    p.goto("/ops/login")
    for _ in range(ACCOUNT_FAILURES):
        p.fill({"#email": ADMIN, "#password": "not " + PASSWORD, "#code": admin_app.code(use=False)})
        p.submit("#user-login button[type=submit]", 401)
    p.fill({"#email": ADMIN, "#password": PASSWORD, "#code": admin_app.code(use=False)})
    p.submit("#user-login button[type=submit]", 429)  # the right password too: no oracle
    assert "Too many failed logins" in p.alert()
    p.shot("22-login-locked")
    user_log_in(p, ADMIN, admin_app, base=relay.base)  # from another address: in
    assert p.page.url == relay.base + "/ops"

    # the owner deactivates the admin: its session ends at once
    user_log_in(p, OWNER, owner_app)
    admin_id = next(u["id"] for u in web_api.get("/v1/admin/users").json()["users"] if u["email"] == ADMIN)
    p.goto("/ops/users")
    p.submit(f'form[action="/ops/users/{admin_id}/deactivate"] button', 200)
    assert web_api.get(f"/v1/admin/users/{admin_id}").json()["active"] is False
    p.goto(relay.base + "/ops")
    assert p.page.url.startswith(relay.base + "/ops/login"), p.page.url
    assert p.shots == [
        "16-users-invited.png",
        "17-setup.png",
        "18-login-wrong-code.png",
        "19-users.png",
        "20-admin-refused.png",
        "21-analyst-refused.png",
        "22-login-locked.png",
    ]


# -- the portals


def portal_set_up(p: Person, link: str, role: str, email: str, shot: str | None = None) -> None:
    """A portal user's set-up link used (no second factor), then its login on /portal/login
    (a wrong password first)."""
    assert set_up(p, link, totp=False) is None
    assert p.path() == "/portal/login?notice=set_up" and "set up" in p.status_text()
    if shot:
        p.shot(shot)
    p.fill({"#email": email, "#password": "not " + PASSWORD})
    p.submit("#login button[type=submit]", 401)
    assert "Wrong e-mail or password." in p.alert()
    p.fill({"#email": email, "#password": PASSWORD})
    p.submit("#login button[type=submit]", 200)
    assert p.path() == f"/portal/{role}", p.path()
    p.goto("/portal")  # the address as typed: the user's portal
    assert p.path() == f"/portal/{role}", p.path()


def portal_log_out(p: Person, role: str) -> None:
    """Log out; the portal's pages then lead to the login form."""
    p.submit("#logout button", 200)
    assert p.path() == "/portal/login?notice=logged_out" and "Logged out" in p.status_text()
    for path in (f"/portal/{role}", "/portal"):
        p.goto(path)
        assert p.path() == "/portal/login", (path, p.path())


def top_up(api: Api, reference: str, minor: int) -> None:
    """A payment naming no wallet, assigned to the buyer's by the operator."""
    raw = encode(without_payer("standard", payload("standard", reference, minor)))
    assert deliver(api, "standard", raw).json() == {"status": "unattributed"}
    done = api.http.post(
        f"{api.base}/v1/admin/payments/standard/{reference}/assign",
        json={"customer": WALLET},
        headers=api.admin,
    )
    assert done.status_code == 200 and done.json()["status"] == "credited", done.text


def test_a_buyer_user_uses_its_portal(
    web_api: Api, worker: object, buyer_server: BuyerServer, page: Page, shots_dir: Path
):
    p = Person(page, web_api, shots_dir)
    api = web_api
    buyer_server.add(BUYER)
    key = api.put_publisher(PUBLISHER)
    billing = {"mode": "prepaid", "account": WALLET, "currency": "NGN"}
    policy = {"window_days": 7, "reasons": ["bad_phone", "duplicate"], "review": "auto"}
    api.put_buyer(BUYER, buyer_server.url(BUYER), price="20.00", billing=billing, returns=policy)
    top_up(api, "portal-topup-1", 50_000)
    wait_until(
        lambda: api.get(f"/v1/admin/buyers/{BUYER}").json()["balance"]["available"] == "500.00", what="the top-up"
    )
    api.settle_config()
    for lead_id in ("pl-1", "pl-2"):
        sold = api.post_lead(key, {"lead_id": lead_id})
        assert sold.status_code == 200 and sold.json()["buyer_id"] == BUYER, sold.text
        api.wait_settled(lead_id, PUBLISHER)

    # an operator invites the buyer's user on the users page: a buyer id that is no buyer first
    log_in(page, api.base, "/ops/users")
    p.fill({"#email": BUYER_USER, "#role": "buyer", "#tenant": "no-such-buyer"})
    p.submit("#invite button[type=submit]", 400)
    assert "buyer_id: no buyer 'no-such-buyer'" in p.alert()
    assert BUYER in p.page.attrs("#tenants option", "value")  # the pick-list
    p.fill({"#email": BUYER_USER, "#role": "buyer", "#tenant": BUYER})
    p.submit("#invite button[type=submit]", 201)
    link = (p.page.text("#setup-link") or "").strip()
    assert p.page.attr(f'#users tr[data-user="{BUYER_USER}"]', "data-role") == "buyer"
    log_out(p)
    portal_set_up(p, link, "buyer", BUYER_USER, shot="23-portal-login")
    assert p.page.text("h1") == f"Buyer {BUYER}"
    assert "460.00" in p.body() and "top it up" in p.body()  # 500.00 less two leads at 20.00
    p.shot("24-buyer-home")

    p.goto("/portal/buyer/sales")
    assert [t.strip() for t in p.page.texts("#sales tbody tr td:first-child")] == ["pl-2", "pl-1"]
    p.shot("25-buyer-sales")
    p.fill({"#lead_id": "pl-1"})  # status and since left empty
    p.submit("#search button[type=submit]", 200)
    assert [t.strip() for t in p.page.texts("#sales tbody tr td:first-child")] == ["pl-1"]
    p.fill({"#lead_id": "", "#since": "yesterday"})
    p.submit("#search button[type=submit]", 400)
    assert "since" in p.alert() and p.page.attr("#since", "value") == "yesterday"
    p.fill({"#since": ""})
    p.submit("#search button[type=submit]", 200)
    rows = list(csv.reader(io.StringIO(p.download("#sales-csv"))))
    assert rows[0][:3] == ["lead_id", "publisher_id", "price"] and sorted(r[0] for r in rows[1:]) == ["pl-1", "pl-2"]

    p.submit('#sales a[href$="/pl-1"]', 200)
    assert p.path() == f"/portal/buyer/sales/{PUBLISHER}/pl-1"
    p.fill({"#reason": "did not like it"})
    p.submit("#return button[type=submit]", 400)
    assert "reason" in p.alert()
    p.shot("26-buyer-return-refused")
    p.fill({"#reason": "bad_phone"})
    p.submit("#return button[type=submit]", 200)
    assert "Returned" in p.status_text()
    sale = api.get("/v1/admin/leads/pl-1", params={"publisher_id": PUBLISHER}).json()
    assert (sale["status"], sale["return_reason"]) == ("returned", "bad_phone"), sale

    p.fill({"#fid": "fb-1", "#event": "sold-on"})  # value left empty
    p.submit("#feedback button[type=submit]", 400)
    assert "event" in p.alert()
    p.fill({"#fid": "fb-1", "#event": "contacted"})
    p.submit("#feedback button[type=submit]", 200)
    assert "feedback is recorded" in p.status_text()
    assert "contacted" in (p.page.text("#feedback-given") or "")
    p.shot("27-buyer-sale")

    p.goto(f"/portal/buyer/sales/{PUBLISHER}/no-such-lead", 404)  # not its sale: a page, and a way back
    assert p.page.text("h1") == "Not found" and "no such lead" in p.alert()
    p.submit("a[href='/portal']", 200)
    assert p.path() == "/portal/buyer"

    p.goto("/portal/buyer/statement")
    figures = dict(zip(p.page.texts("#statement dt"), p.page.texts("#statement dd")))
    assert figures["top_ups"].startswith("500.00") and figures["spend"].startswith("40.00"), figures
    assert figures["returns"].startswith("20.00") and figures["closing"].startswith("480.00"), figures
    lines = list(csv.reader(io.StringIO(p.download("#statement-csv"))))
    assert len(lines) == 1 + 4, lines  # the top-up, two sales, the return
    p.shot("28-buyer-statement")

    p.goto("/portal/buyer")
    p.submit("#new-key button[type=submit]", 200)
    new_key = (p.page.text("#api-key") or "").strip()
    assert new_key.startswith("bk_")
    listed = requests.get(
        p.url("/v1/buyer/leads"), headers={"Authorization": f"Bearer {new_key}", "Connection": "close"}, timeout=30
    )
    assert listed.status_code == 200 and {i["lead_id"] for i in listed.json()["items"]} == {"pl-1", "pl-2"}
    p.shot("29-buyer-key")
    p.goto("/portal/buyer")
    assert p.page.text("#api-key") is None  # shown once
    portal_log_out(p, "buyer")


def test_a_publisher_user_uses_its_portal(
    web_api: Api, worker: object, buyer_server: BuyerServer, page: Page, shots_dir: Path
):
    p = Person(page, web_api, shots_dir)
    api = web_api
    buyer_server.add(BUYER)
    key = api.put_publisher(PUBLISHER, commission_pct="10", payout_hold_days=7, precheck={"per_lead": 5})
    api.put_buyer(BUYER, buyer_server.url(BUYER), price="20.00")
    api.settle_config()
    sold = api.post_lead(key, {"lead_id": "pub-1"})
    assert sold.json()["buyer_id"] == BUYER, sold.text
    buyer_server.buyers[BUYER].mode = "reject"
    assert api.post_lead(key, {"lead_id": "pub-2"}).json().get("buyer_id") is None
    for lead_id in ("pub-1", "pub-2"):
        api.wait_settled(lead_id, PUBLISHER)

    # created by an operator through the admin API
    body = {"email": PUBLISHER_USER, "role": "publisher", "publisher_id": PUBLISHER}
    invited = api.http.post(f"{api.base}/v1/admin/users", json=body, headers=api.admin)
    assert invited.status_code == 201, invited.text
    portal_set_up(p, invited.json()["setup_url"], "publisher", PUBLISHER_USER)
    assert p.page.text("h1") == f"Publisher {PUBLISHER}"
    figures = dict(zip(p.page.texts("#payouts dt"), p.page.texts("#payouts dd")))
    assert figures == {"payable (balance)": "0.00", "held": "2.00"}, figures  # 10 % of 20.00, held 7 days
    assert "Pre-ping quota" in p.body()
    p.shot("30-publisher-home")

    p.goto("/portal/publisher/leads")
    assert [t.strip() for t in p.page.texts("#leads tbody tr td:first-child")] == ["pub-2", "pub-1"]
    p.shot("31-publisher-leads")
    p.fill({"#status": "nope"})
    p.submit("#search button[type=submit]", 400)
    assert "status" in p.alert()
    p.fill({"#status": "unsold"})  # lead id left empty
    p.submit("#search button[type=submit]", 200)
    assert [t.strip() for t in p.page.texts("#leads tbody tr td:first-child")] == ["pub-2"]
    p.goto("/portal/publisher/leads")
    p.submit('#leads a[href$="/pub-1"]', 200)
    assert "2.00" in p.body() and "held" in p.body()

    p.goto("/portal/publisher/statement")
    assert "pub-1" in p.body()
    lines = list(csv.reader(io.StringIO(p.download("#statement-csv"))))
    assert any("pub-1" in line for line in lines), lines
    p.shot("32-publisher-statement")

    p.goto("/portal/publisher")
    p.submit("#new-key button[type=submit]", 200)
    new_key = (p.page.text("#api-key") or "").strip()
    assert new_key.startswith("pk_")
    api.settle_config()
    assert api.post_lead(key, {"lead_id": "pub-3"}).status_code == 401  # the old key is gone
    buyer_server.buyers[BUYER].mode = "accept"
    assert api.post_lead(new_key, {"lead_id": "pub-3"}).json()["buyer_id"] == BUYER
    p.shot("33-publisher-key")
    portal_log_out(p, "publisher")
