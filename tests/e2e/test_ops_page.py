"""/ops (the operator page) in a real headless Chromium, and the token rules of /ops and the
RQ dashboard at /ops/rq."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import requests

from tests.conftest import ADMIN_TOKEN

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1280,900",
]


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium, installed with apt-get if this machine has none."""
    if not os.path.exists(CHROMIUM):
        if shutil.which("apt-get") is None:
            pytest.fail(f"{CHROMIUM} is missing and apt-get is not there to install Debian's chromium")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for args in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                pytest.fail(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return CHROMIUM


def browse(chromium: str, url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    """One headless Chromium run on a fresh profile."""
    return subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={profile}", *extra, url], capture_output=True, text=True, timeout=120
    )


class Bars(HTMLParser):
    """Collects the progress bars and breaker badges of the rendered DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.bars: dict[tuple[str, str], int] = {}
        self.breakers: list[str] = []
        self.publisher_breakers: list[tuple[str, str]] = []  # (publisher, state), per buyer in order

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if a.get("role") == "progressbar":
            self.bars[(a["data-buyer"], a["data-cap"])] = int(a["aria-valuenow"])
        if "data-breaker" in a:
            self.breakers.append(a["data-breaker"])
        if "data-publisher-breaker" in a:
            self.publisher_breakers.append((a["data-publisher-breaker"], a["data-state"]))


def test_ops_page_renders_cap_bars_breakers_and_last_leads_in_chromium(
    web_api, worker, buyer_server, chromium, tmp_path
):
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

    url = f"{api.base}/ops?token={ADMIN_TOKEN}"  # the browser's way in: token once, then a cookie
    dump = browse(chromium, url, tmp_path / "profile-dom", "--dump-dom")
    assert dump.returncode == 0, dump.stderr[-3000:]
    page = Bars()
    page.feed(dump.stdout)
    assert page.bars == {("acme", "hourly"): 30, ("acme", "daily"): 3, ("acme", "daily_budget"): 15}
    assert not any(b[0] == "flaky" for b in page.bars)  # no caps: no bars
    flaky, acme = page.breakers  # waterfall order: each buyer's circuit for every publisher
    assert acme == "closed" and flaky == "closed"
    ((publisher, state),) = page.publisher_breakers  # flaky's 1.5 s cool-down may be over already
    assert publisher == "pub" and state in ("open", "half_open")
    assert 'data-lead="ops-2"' in dump.stdout and "flaky: error" in dump.stdout
    assert ADMIN_TOKEN not in dump.stdout

    shot = tmp_path / "ops.png"
    run = browse(chromium, url, tmp_path / "profile-shot", f"--screenshot={shot}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_ops_pages_need_the_admin_token(web):
    base = web.url
    for path in ("/ops", "/ops/rq/", "/ops/rq/0/data/queues.json"):
        for kw in (
            {},
            {"headers": {"Authorization": "Bearer wrong"}},
            {"params": {"token": "wrong"}},
            {"cookies": {"floodgate_ops": "wrong"}},
        ):
            resp = requests.get(base + path, allow_redirects=False, timeout=10, **kw)
            assert resp.status_code == 401, (path, kw)
            assert resp.json()["error"]["code"] == "unauthorized"


def test_query_token_becomes_a_cookie_that_opens_the_rq_dashboard(web):
    session = requests.Session()
    resp = session.get(f"{web.url}/ops/rq/?token={ADMIN_TOKEN}&x=1", allow_redirects=False, timeout=10)
    assert resp.status_code == 303 and resp.headers["Location"] == "/ops/rq/?x=1"
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ops" in cookie
    page = session.get(web.url + "/ops/rq/", timeout=10)
    assert page.status_code == 200 and "RQ dashboard" in page.text
    queues = session.get(web.url + "/ops/rq/0/data/queues.json", timeout=10)
    assert queues.status_code == 200 and "queues" in queues.json()
    header = requests.get(
        web.url + "/ops/rq/0/data/workers.json", timeout=10, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert header.status_code == 200 and "workers" in header.json()


def test_markup_in_job_metadata_does_not_run_on_the_dashboard(web, queue_server, chromium, tmp_path):
    """rq-dashboard renders a job's description and metadata without escaping. Floodgate puts
    no caller input there, and should anything ever slip in, the dashboard's CSP (no inline
    event handlers, inline script by nonce only) keeps it from running: the markup is in the
    page, its handler never fires."""
    from redis import Redis
    from rq import Queue

    evil = '<img src="x" id="evil" onerror="document.body.setAttribute(\'data-pwned\', \'yes\')">'
    job = Queue("floodgate", connection=Redis.from_url(queue_server.url)).enqueue(
        "workers.settle.drain", description=evil, meta={"note": evil}
    )
    dump = browse(
        chromium,
        f"{web.url}/ops/rq/0/view/job/{job.id}?token={ADMIN_TOKEN}",
        tmp_path / "profile",
        "--virtual-time-budget=8000",
        "--dump-dom",
    )
    job.delete()
    assert dump.returncode == 0, dump.stderr[-3000:]
    assert 'id="evil"' in dump.stdout  # the dashboard did render it as markup...
    assert 'data-pwned="yes"' not in dump.stdout  # ...and its handler did not run
    assert "Origin queue" in dump.stdout  # the dashboard's own scripts did (they render the job)


class Chart(HTMLParser):
    """The series of the 24-hour chart, from the rendered DOM: one entry per hour group."""

    def __init__(self) -> None:
        super().__init__()
        self.hours: list[dict] = []
        self.revenue_points = ""

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "g" and a.get("class") == "hour":
            self.hours.append(a)
        if tag == "polyline" and a.get("class") == "revenue-line":
            self.revenue_points = a.get("points", "")


def test_ops_chart_of_the_last_24_hours_in_chromium(web_api, worker, buyer_server, chromium, tmp_path):
    api = web_api
    buyer_server.add("acme")
    key = api.put_publisher("pub")
    api.put_buyer("acme", buyer_server.url("acme"), price="12.50", states=["TX"])
    api.settle_config()
    for i in range(4):  # three sold, one unsold (not TX)
        api.post_lead(key, {"lead_id": f"chart-{i}", "state": "TX" if i < 3 else "CA"})
    api.wait_settled("chart-3", "pub")
    url = f"{api.base}/ops?token={ADMIN_TOKEN}"
    log = tmp_path / "console.log"
    dump = browse(chromium, url, tmp_path / "profile-chart", "--dump-dom", "--enable-logging=stderr", "--v=0")
    assert dump.returncode == 0, dump.stderr[-3000:]
    log.write_text(dump.stderr)
    assert "Uncaught" not in dump.stderr and "CONSOLE" not in dump.stderr  # no script error (the page runs none)
    chart = Chart()
    chart.feed(dump.stdout)
    assert len(chart.hours) == 24
    now = chart.hours[-1]  # the current hour, last
    assert (now["data-leads"], now["data-sold"], now["data-revenue"]) == ("4", "3", "37.50")
    assert all(h["data-leads"] == "0" for h in chart.hours[:-1])
    assert len(chart.revenue_points.split()) == 24
    assert 'aria-label="Leads and sold leads per hour' in dump.stdout
    assert "/ops/reports/leads.csv" in dump.stdout
    shot = tmp_path / "chart.png"
    run = browse(chromium, url, tmp_path / "profile-chart-shot", f"--screenshot={shot}")
    assert run.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv_text = requests.get(f"{api.base}/ops/reports/leads.csv", headers=api.admin, timeout=10).text
    assert csv_text.startswith("key,leads,sold,unsold,returned,revenue,payout,profit,return_rate\n")
    assert ",4,3,1,0,37.50,0.00,37.50,0\n" in csv_text
