"""/ops (the operator page) in a real headless Chromium (testkit.browser, logged in through the
console's form), and the session rules of /ops and the RQ dashboard at /ops/rq."""

from __future__ import annotations

from html.parser import HTMLParser
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from testkit.browser import Page
from testkit.config import ADMIN_TOKEN
from testkit.servers import BuyerServer, RedisServer, WebServer, wait_until
from tests.conftest import Api
from tests.e2e.conftest import log_in, page_errors

PNG = b"\x89PNG\r\n\x1a\n"


class Bars(HTMLParser):
    """Collects the progress bars and breaker badges of the rendered DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.bars: dict[tuple[str, str], int] = {}
        self.breakers: list[str] = []
        self.publisher_breakers: list[tuple[str, str]] = []  # (publisher, state), per buyer in order

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {name: value or "" for name, value in attrs}
        if a.get("role") == "progressbar":
            self.bars[(a["data-buyer"], a["data-cap"])] = int(a["aria-valuenow"])
        if "data-breaker" in a:
            self.breakers.append(a["data-breaker"])
        if "data-publisher-breaker" in a:
            self.publisher_breakers.append((a["data-publisher-breaker"], a["data-state"]))


def test_ops_page_renders_cap_bars_breakers_and_last_leads_in_chromium(
    web_api: Api, worker: object, buyer_server: BuyerServer, page: Page, tmp_path: Path
) -> None:
    api = web_api  # the browser needs a server
    buyer_server.add("acme")
    buyer_server.add("flaky", mode="error500")
    key = api.put_publisher("pub")
    api.put_buyer(
        "acme", buyer_server.url("acme"), priority=2, caps={"hourly": 10, "daily": 100, "daily_budget": "200.00"}
    )
    api.put_buyer("flaky", buyer_server.url("flaky"), priority=1)
    api.settle_config()
    for i in range(3):  # flaky fails pub's leads three times (BREAKER_FAILURES=3): its circuit for pub opens
        assert api.post_lead(key, {"lead_id": f"ops-{i}"}).json()["buyer_id"] == "acme"
    api.wait_settled("ops-2", "pub")

    log_in(page, api.base)  # the browser's way in: the login form, then the session's cookie
    dom = page.html()
    bars = Bars()
    bars.feed(dom)
    assert bars.bars == {("acme", "hourly"): 30, ("acme", "daily"): 3, ("acme", "daily_budget"): 15}
    assert not any(b[0] == "flaky" for b in bars.bars)  # no caps: no bars
    flaky, acme = bars.breakers  # waterfall order: each buyer's circuit for every publisher
    assert acme == "closed" and flaky == "closed"
    ((publisher, state),) = bars.publisher_breakers  # flaky's 1.5 s cool-down may be over already
    assert publisher == "pub" and state in ("open", "half_open")
    assert 'data-lead="ops-2"' in dom and "flaky: error" in dom
    assert ADMIN_TOKEN not in dom
    assert page_errors(page) == []

    shot = page.screenshot(tmp_path / "ops.png")
    assert shot.read_bytes()[:8] == PNG and shot.stat().st_size > 10_000


def test_ops_pages_need_the_admin_token(web: WebServer) -> None:
    """Without a live session a browser is sent to the login form (as is one with a wrong
    `?token=` or a cookie naming no session); a wrong bearer header is the admin API's 401."""
    base = web.url
    for path in ("/ops", "/ops/rq/", "/ops/rq/0/data/queues.json"):
        ways: tuple[dict[str, Any], ...] = (
            {},
            {"params": {"token": "wrong"}},
            {"cookies": {"floodgate_ops": "wrong"}},
        )
        for kw in ways:
            resp = requests.get(base + path, allow_redirects=False, timeout=10, **kw)
            assert resp.status_code == 303, (path, kw, resp.status_code)
            assert resp.headers["Location"] == f"/ops/login?next={quote(path)}", (path, kw)
            assert "Set-Cookie" not in resp.headers, (path, kw)
        resp = requests.get(base + path, allow_redirects=False, timeout=10, headers={"Authorization": "Bearer wrong"})
        assert resp.status_code == 401, path
        assert resp.json()["error"]["code"] == "unauthorized"


def test_the_login_form_opens_a_session_whose_cookie_opens_the_rq_dashboard(web: WebServer) -> None:
    session = requests.Session()
    wrong = session.post(f"{web.url}/ops/login", data={"token": "wrong", "next": "/ops/rq/"}, timeout=10)
    assert wrong.status_code == 401 and "Set-Cookie" not in wrong.headers
    resp = session.post(
        f"{web.url}/ops/login", data={"token": ADMIN_TOKEN, "next": "/ops/rq/"}, allow_redirects=False, timeout=10
    )
    assert resp.status_code == 303 and resp.headers["Location"] == "/ops/rq/"
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ops" in cookie
    assert ADMIN_TOKEN not in cookie and SimpleCookie(cookie)["floodgate_ops"].value
    page = session.get(web.url + "/ops/rq/", allow_redirects=False, timeout=10)
    assert page.status_code == 200 and "RQ dashboard" in page.text
    queues = session.get(web.url + "/ops/rq/0/data/queues.json", allow_redirects=False, timeout=10)
    assert queues.status_code == 200 and "queues" in queues.json()
    header = requests.get(
        web.url + "/ops/rq/0/data/workers.json", timeout=10, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert header.status_code == 200 and "workers" in header.json()
    # the address token the contract keeps for links made before the form: swapped for a
    # session, the address answered again without it
    linked = requests.Session()
    resp = linked.get(f"{web.url}/ops/rq/?token={ADMIN_TOKEN}&x=1", allow_redirects=False, timeout=10)
    assert resp.status_code == 303 and resp.headers["Location"] == "/ops/rq/?x=1"
    assert ADMIN_TOKEN not in resp.headers["Set-Cookie"] and resp.headers["Referrer-Policy"] == "no-referrer"
    assert linked.get(web.url + "/ops/rq/0/data/queues.json", allow_redirects=False, timeout=10).status_code == 200


def test_markup_in_job_metadata_does_not_run_on_the_dashboard(
    web: WebServer, queue_server: RedisServer, page: Page
) -> None:
    """rq-dashboard renders a job's description and metadata without escaping. Floodgate puts
    no caller input there, and should anything ever slip in, the dashboard's CSP (no inline
    event handlers, inline script by nonce only) keeps it from running: the markup is in the
    page, its handler never fires, and the browser reports the violation."""
    from redis import Redis
    from rq import Queue

    evil = '<img src="x" id="evil" onerror="document.body.setAttribute(\'data-pwned\', \'yes\')">'
    job = Queue("floodgate", connection=Redis.from_url(queue_server.url)).enqueue(
        "workers.settle.drain", description=evil, meta={"note": evil}
    )
    try:
        log_in(page, web.url, f"/ops/rq/0/view/job/{job.id}")
        # the dashboard's own scripts run (they render the job) ...
        wait_until(lambda: "Origin queue" in page.html(), timeout=15, what="the dashboard's job view")
        wait_until(lambda: page.text("#evil") is not None, timeout=15, what="the job's description rendered")
        # ... and the handler the browser tried to run was refused by the CSP
        wait_until(
            lambda: any("Content Security Policy" in e for e in page.console_errors),
            timeout=15,
            what="the CSP violation of the inline handler",
        )
    finally:
        job.delete()
    assert 'id="evil"' in page.html()  # the dashboard did render it as markup...
    assert page.attr("body", "data-pwned") is None  # ...and its handler did not run
    assert page.evaluate("document.body.hasAttribute('data-pwned')") is False


class Chart(HTMLParser):
    """The series of the 24-hour chart, from the rendered DOM: one entry per hour group."""

    def __init__(self) -> None:
        super().__init__()
        self.hours: list[dict[str, str]] = []
        self.revenue_points = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {name: value or "" for name, value in attrs}
        if tag == "g" and a.get("class") == "hour":
            self.hours.append(a)
        if tag == "polyline" and a.get("class") == "revenue-line":
            self.revenue_points = a.get("points", "")


def test_ops_chart_of_the_last_24_hours_in_chromium(
    web_api: Api, worker: object, buyer_server: BuyerServer, page: Page, tmp_path: Path
) -> None:
    api = web_api
    buyer_server.add("acme")
    key = api.put_publisher("pub")
    api.put_buyer("acme", buyer_server.url("acme"), price="12.50", states=["TX"])
    api.settle_config()
    for i in range(4):  # three sold, one unsold (not TX)
        api.post_lead(key, {"lead_id": f"chart-{i}", "state": "TX" if i < 3 else "CA"})
    api.wait_settled("chart-3", "pub")
    log_in(page, api.base)
    assert page_errors(page) == []  # no script error (the page runs none), no CSP violation
    dom = page.html()
    chart = Chart()
    chart.feed(dom)
    assert len(chart.hours) == 24
    now = chart.hours[-1]  # the current hour, last
    assert (now["data-leads"], now["data-sold"], now["data-revenue"]) == ("4", "3", "37.50")
    assert all(h["data-leads"] == "0" for h in chart.hours[:-1])
    assert len(chart.revenue_points.split()) == 24
    assert 'aria-label="Leads and sold leads per hour' in dom
    assert "/ops/reports/leads.csv" in dom
    shot = page.screenshot(tmp_path / "chart.png")
    assert shot.read_bytes()[:8] == PNG
    csv_text = requests.get(f"{api.base}/ops/reports/leads.csv", headers=api.admin, timeout=10).text
    header = "key,leads,sold,unsold,sales,returned,revenue,payout,profit,return_rate"
    assert csv_text.startswith(header + ",offers,accept_rate,conversions,epl\n")
    assert ",4,3,1,3,0,37.50,0.00,37.50,0,3,1,0,12.50\n" in csv_text  # the CA lead: filtered, no offer
