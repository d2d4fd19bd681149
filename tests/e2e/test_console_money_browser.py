"""The console's money pages used in a real headless Chromium as a person uses them, against
gunicorn, Redis and the database: the payments search (a wrong currency, then a right one,
the other filters left empty; a day picked), a wallet looked up (a wallet with a space, then
one), an event endpoint made with its optional fields empty (a wrong URL first; its secret
shown once) and paused, and a suppression list made, filled from its form and from a file
uploaded (a refused line named by its number). A screenshot of each page lands in
$FG_SCREENSHOTS when set, else in the test's tmp_path."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from testkit.browser import Page
from testkit.payments import deliver, encode, payload
from tests.conftest import Api
from tests.e2e.conftest import log_in
from tests.e2e.test_console_forms_browser import Person as FormsPerson

pytestmark = pytest.mark.e2e


class Person(FormsPerson):
    """The browser's tab on the console, the admin API beside it, its screenshots in `shots`."""

    def __init__(self, page: Page, api: Api, shots: Path):
        super().__init__(page, api)
        self.shots = shots

    def shot(self, name: str) -> None:
        self.page.screenshot(self.shots / f"{name}.png")

    def path(self) -> str:
        return self.page.url.removeprefix(self.api.base)

    def attach(self, css: str, path: Path) -> None:
        """Choose `path` in the file input `css`, as the file dialog would."""
        root = self.page.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
        node = self.page.send("DOM.querySelector", {"nodeId": root, "selector": css})["nodeId"]
        assert node, css
        self.page.send("DOM.setFileInputFiles", {"nodeId": node, "files": [str(path)]})


def test_the_money_pages_as_a_person_uses_them(web_api: Api, page: Page, tmp_path: Path):
    shots = Path(os.environ.get("FG_SCREENSHOTS") or tmp_path).resolve()
    shots.mkdir(parents=True, exist_ok=True)
    person = Person(page, web_api, shots)
    for reference, amount, currency, email in (
        ("mb-usd", 4_000, "USD", "ada@example.com"),
        ("mb-ngn", 9_000, "NGN", "bob@example.com"),
    ):
        raw = encode(payload("standard", reference, amount, currency=currency, email=email))
        assert deliver(web_api, "standard", raw).json()["status"] == "credited"
    log_in(page, web_api.base, "/ops/payments")
    search_payments(person)
    look_up_a_wallet(person)
    make_an_endpoint(person)
    fill_a_suppression_list(person, tmp_path)


def search_payments(p: Person) -> None:
    """Every payment listed; "XYZ" for a currency refused above the list and kept in its field;
    "usd" with the other filters empty: its payment; today picked as the first day: the same."""
    assert p.page.attrs("#payments tbody tr", "data-listed")[:2] == ["standard:mb-ngn", "standard:mb-usd"]
    p.fill({"#payment-search input[name=currency]": "XYZ"})
    p.submit("#payment-search", 400)
    assert p.errors() == ["currency"], p.errors()
    assert p.page.attr("#payment-search input[name=currency]", "value") == "XYZ"
    assert p.page.attrs("#payments tbody tr[data-listed]", "data-listed") == []

    p.fill({"#payment-search input[name=currency]": "usd"})
    p.submit("#payment-search", 200)
    assert p.errors() == []
    assert p.page.attrs("#payments tbody tr[data-listed]", "data-listed") == ["standard:mb-usd"]
    assert "currency=usd" in (p.page.attr("#payments-csv", "href") or "")

    today = datetime.now(timezone.utc).date().isoformat()
    p.fill({"#payment-search input[name=from]": today})
    p.submit("#payment-search", 200)
    assert p.page.attrs("#payments tbody tr[data-listed]", "data-listed") == ["standard:mb-usd"]
    p.shot("37-payments")


def look_up_a_wallet(p: Person) -> None:
    """A wallet with a space in it refused; the payer's e-mail as typed, currency left empty:
    its balance in each currency it holds, its payment and its top-up."""
    p.goto("/ops/payments")
    p.fill({"#wallet-lookup input[name=account]": "ada lovelace"})
    p.submit("#wallet-lookup", 400)
    assert p.errors() == ["account"], p.errors()
    p.fill({"#wallet-lookup input[name=account]": " Ada@Example.com"})
    p.submit("#wallet-lookup", 200)
    assert p.page.attr("#wallet", "data-wallet") == "ada@example.com"
    assert p.page.attrs("[data-balance]", "data-amount") == ["40.00"]
    assert p.page.attrs("#wallet-moves tbody tr", "data-kind") == ["top_up"]
    p.shot("38-wallet")


def make_an_endpoint(p: Person) -> None:
    """A new endpoint with an ftp URL and the optional fields empty: refused beside the URL,
    nothing made; an https URL: made, its secret shown once, every event; then paused."""
    p.goto("/ops/events")
    p.fill({"#ep-id": "app-money", "#ep-url": "ftp://app.example/hooks"})
    p.submit("#endpoint-new", 400)
    assert p.errors() == ["url"], p.errors()
    p.shot("39-endpoint-refused")
    assert p.page.attr("#ep-url", "value") == "ftp://app.example/hooks"
    assert p.api.get("/v1/admin/event-endpoints/app-money").status_code == 404

    p.fill({"#ep-url": "https://app.example/hooks"})
    p.submit("#endpoint-new", 201)
    secret = (p.page.text("#endpoint-secret") or "").strip()
    got = p.api.get("/v1/admin/event-endpoints/app-money").json()
    assert secret.startswith("whsec_") and got["secret"].endswith(secret[-4:]) and got["secret"] != secret
    assert got["enabled"] is True and got["publisher_id"] is None and len(got["types"]) > 2, got
    p.shot("40-endpoint-secret")

    p.submit("#endpoint form.inline", 200)  # its first button: Pause
    assert p.path() == "/ops/events/endpoints/app-money?notice=paused", p.path()
    assert p.page.attr("#endpoint", "data-enabled") == "false" and secret not in p.page.html()
    assert p.api.get("/v1/admin/event-endpoints/app-money").json()["enabled"] is False


def fill_a_suppression_list(p: Person, tmp_path: Path) -> None:
    """A list with an id of two words refused; then made; two lines typed, one not an e-mail:
    one added, the other named by its line; a CSV file uploaded: its e-mails added."""
    p.goto("/ops/suppression")
    p.fill({"#sl-id": "do not call", "#sl-hash": "none"})
    p.submit("#list-new", 400)
    assert p.errors() == ["id"], p.errors()
    p.fill({"#sl-id": "dnc"})
    p.submit("#list-new", 200)
    assert p.path() == "/ops/suppression/dnc?notice=created", p.path()

    p.fill({"#e-add": "Ada@Example.com\nnot an e-mail"})
    p.submit("#entries", 200)
    result = {k: p.page.attr("#change-result", f"data-{k}") for k in ("read", "added", "invalid")}
    assert result == {"read": "2", "added": "1", "invalid": "1"}, result
    assert p.page.attrs("#invalid-lines li[data-line]", "data-line") == ["2"]

    upload = tmp_path / "dnc.csv"
    upload.write_text("email,name\nbob@example.com,Bob\ncy@example.com,Cy\n", encoding="utf-8")
    p.attach("#u-file", upload)
    p.submit("#upload", 200)
    result = {k: p.page.attr("#change-result", f"data-{k}") for k in ("read", "added", "invalid")}
    assert result == {"read": "3", "added": "2", "invalid": "1"}, result  # the header line refused
    assert p.api.get("/v1/admin/suppression-lists/dnc").json()["size"] == 3
    p.shot("41-suppression-upload")
    p.goto("/ops/audit")
    p.shot("42-audit")
