"""GET /metrics: prometheus_client in multiprocess mode. Counters of every gunicorn worker (and
of other processes sharing PROMETHEUS_MULTIPROC_DIR, such as the CLI or RQ workers) appear
summed in one scrape, whichever worker answers it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from testkit.servers import ROOT, WebServer, venv_bin, wait_until
from tests.conftest import Api
from webhooks.caps import leases
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage.records.models import Buyer


def samples(text: str) -> dict[tuple, float]:
    """{(sample name, frozenset of labels): value} of an exposition."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scraped: dict, name: str, **labels) -> float:
    return scraped.get((name, frozenset(labels.items())), 0.0)


def worker_pids(master_pid: int) -> set[int]:
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    return {int(pid) for pid in children}


@pytest.fixture
def metrics_web(base_env, tmp_path):
    """Two gunicorn workers sharing a private metrics directory."""
    env = {**base_env, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")}
    server = WebServer(env, tmp_path / "web.log", workers=2)
    server.env = env
    yield server
    server.stop()


def _send_leads(api: Api, key: str, start: int, count: int) -> int:
    """`count` leads at once, each on its own connection, so both workers accept some; how
    many were sold (a buyer connection reset under load makes one unsold: the scrape must
    count what happened, whichever it was)."""
    sold = []

    def post(i: int) -> None:
        resp = requests.post(
            f"{api.base}/v1/leads",
            json={"lead_id": f"m{i}", "state": "TX"},
            headers={"Authorization": f"Bearer {key}", "Connection": "close"},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
        sold.append(resp.json()["status"] == "sold")

    threads = [threading.Thread(target=post, args=(i,)) for i in range(start, start + count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(sold) == count  # every request was answered
    return sum(sold)


def test_counters_of_two_workers_are_summed_in_one_scrape(metrics_web, buyer_server, tmp_path):
    api = Api(metrics_web.url)
    buyer_server.add("acme", delay=0.05)  # overlapping requests spread over both workers
    key = api.put_publisher("pub")
    api.put_buyer("acme", buyer_server.url("acme"), priority=2)
    api.put_buyer("capped", buyer_server.url("capped"), priority=1, caps={"hourly": 0})
    api.settle_config()
    prom = tmp_path / "prom"
    workers = worker_pids(metrics_web.pid)
    assert len(workers) == 2

    sent = sold = 0
    while not all((prom / f"counter_{pid}.db").exists() for pid in workers):
        assert sent < 400, "one worker never served a lead"
        sold += _send_leads(api, key, sent, 20)
        sent += 20

    for _ in range(4):  # whichever worker answers the scrape, it sums both
        scraped = samples(requests.get(metrics_web.url + "/metrics", timeout=10).text)
        assert value(scraped, "floodgate_leads_total", outcome="sold") == sold
        assert value(scraped, "floodgate_publisher_response_seconds_count", outcome="sold") == sold
        assert value(scraped, "floodgate_buyer_attempts_total", buyer_id="acme", outcome="accepted") == sold
        assert value(scraped, "floodgate_buyer_delivery_seconds_count", buyer_id="acme") == sent  # one each
        assert value(scraped, "floodgate_cap_refusals_total", buyer_id="capped", cap="hourly") == sent

    # A killed worker's counts stay (gunicorn replaces it; child_exit marks it dead).
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(worker_pids(metrics_web.pid) - {victim}) == 2, what="a replacement worker")
    sold += _send_leads(api, key, sent, 2)
    scraped = samples(requests.get(metrics_web.url + "/metrics", timeout=10).text)
    assert value(scraped, "floodgate_leads_total", outcome="sold") == sold


def test_scrape_reports_replays_errors_payments_breakers_and_queues(metrics_web, buyer_server):
    api = Api(metrics_web.url)
    with socket.socket() as s:  # a port nothing listens on: the buyer refuses every connection
        s.bind(("127.0.0.1", 0))
        down_url = f"http://127.0.0.1:{s.getsockname()[1]}/down"
    key = api.put_publisher("pub")
    api.put_buyer("down", down_url)
    api.settle_config()
    for _ in range(2):
        assert api.post_lead(key, {"lead_id": "r1"}).json()["status"] == "unsold"
    assert api.post_lead(key, {"lead_id": "t1", "test": True}).json()["test"] is True
    assert api.post_lead("pk_unknown_0123456789", {}).status_code == 401
    assert requests.post(metrics_web.url + "/v1/webhooks/paystack", data=b"{}", timeout=10).status_code == 401

    scraped = samples(requests.get(metrics_web.url + "/metrics", timeout=10).text)
    assert value(scraped, "floodgate_leads_total", outcome="unsold") == 1
    assert value(scraped, "floodgate_leads_total", outcome="replayed") == 1
    assert value(scraped, "floodgate_leads_total", outcome="test") == 1
    assert value(scraped, "floodgate_leads_total", outcome="error") == 1
    assert value(scraped, "floodgate_buyer_attempts_total", buyer_id="down", outcome="error") == 1
    assert value(scraped, "floodgate_payment_deliveries_total", provider="paystack", status="invalid_signature") == 1
    assert value(scraped, "floodgate_breaker_failures", buyer_id="down") == 1
    assert value(scraped, "floodgate_breaker_state", buyer_id="down") == 0  # closed: 1 of 3 failures
    assert value(scraped, "floodgate_breaker_publishers_open", buyer_id="down") == 0
    assert value(scraped, "floodgate_redis_up") == 1
    for name in ("floodgate_rq_queue_depth", "floodgate_rq_failed_jobs"):
        assert (name, frozenset({("queue", "floodgate")})) in scraped
    assert ("floodgate_settlements_pending", frozenset()) in scraped


def test_reconciliation_run_elsewhere_reports_its_drift_in_the_web_scrape(metrics_web, redis_server, buyer_server):
    """The CLI (like an RQ worker) writes to the same directory: its drift shows up here."""
    api = Api(metrics_web.url)
    api.put_buyer("acme", buyer_server.url("acme"), caps={"daily": 100})
    rule = BuyerRule.from_row(Buyer.get_by_id("acme"))
    for _ in range(2):  # again once when a day began while it ran: it reconciled the new window
        window = leases.windows(rule, datetime.now(timezone.utc))[0][2]
        # five sales Redis believes in, none in the ledger
        redis_server.client().set(leases.counter_key("acme", window), 5)
        out = subprocess.run(
            [venv_bin("flask"), "--app", "wsgi", "caps", "reconcile"],
            env=metrics_web.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if leases.windows(rule, datetime.now(timezone.utc))[0][2] == window:
            break
    assert out.returncode == 0, out.stderr
    assert "1 drift(s) corrected" in out.stdout
    scraped = samples(requests.get(metrics_web.url + "/metrics", timeout=10).text)
    assert value(scraped, "floodgate_cap_drift", buyer_id="acme", cap="daily") == -5
    assert value(scraped, "floodgate_reconcile_last_run_timestamp_seconds") > 0
