"""Logs carry no payer e-mail at WARNING or above (the payment reference instead) and no
secret at any level: provider secrets, the admin token, the ops session, URL credentials."""

from __future__ import annotations

import json
import logging

import pytest
import requests

from testkit.payments import deliver, encode, payload, signed_headers
from testkit.servers import WebServer, wait_until
from tests.conftest import ADMIN_TOKEN, SECRETS, Api
from webhooks.logs import JsonFormatter

PAYER, OTHER = "ada.lovelace@example.com", "mallory@example.com"


def test_reference_conflict_is_logged_by_reference_without_e_mails(api, caplog):
    deliver(api, "paystack", encode(payload("paystack", "ps-logged", 10000, email=PAYER)))
    with caplog.at_level(logging.WARNING):
        resp = deliver(api, "paystack", encode(payload("paystack", "ps-logged", 10000, email=OTHER)))
    assert resp.status_code == 422
    lines = [JsonFormatter().format(r) for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("ps-logged" in line for line in lines), lines
    assert not any(PAYER in line or OTHER in line for line in lines), lines


@pytest.mark.e2e  # a gunicorn of its own, with its access log
def test_a_busy_web_process_logs_no_secret_and_no_e_mail_at_warning(base_env, tmp_path):
    log = tmp_path / "web.log"
    server = WebServer({**base_env, "ACCESS_LOG": "-"}, log, workers=1)
    try:
        api = Api(server.url)
        raw = encode(payload("paystack", "ps-busy", 10000, email=PAYER))
        deliver(server.url, "paystack", raw)
        deliver(server.url, "paystack", encode(payload("paystack", "ps-busy", 999, email=OTHER)))  # 422
        flw = encode(payload("flutterwave", "flw-busy", 10000, email=PAYER))
        deliver(server.url, "flutterwave", flw, headers={"verif-hash": "a-wrong-guess-of-the-hash"})
        deliver(server.url, "flutterwave", flw)  # the real hash, in a header
        deliver(server.url, "stripe", raw, headers=signed_headers("stripe", raw, secret="whsec_wrong"))
        session = requests.Session()
        session.get(f"{server.url}/ops?token={ADMIN_TOKEN}", timeout=10)
        session.get(f"{server.url}/ops/rq/0/data/queues.json", timeout=10)
        requests.get(
            f"{server.url}/v1/admin/buyers/x", headers={"Authorization": "Bearer a-wrong-admin-token"}, timeout=10
        )
        api.put_publisher("surge", api_key="pk_live_secret_publisher_key")
        wait_until(lambda: log.read_text().count("/v1/webhooks/") >= 5, what="the access log lines")
    finally:
        server.stop()
    text = log.read_text()
    cookie = session.cookies.get("floodgate_ops")
    for secret in [*SECRETS.values(), ADMIN_TOKEN, cookie, "pk_live_secret_publisher_key"]:
        assert secret not in text, f"a secret is in the log: {secret[:6]}..."
    warnings = [
        line
        for line in text.splitlines()
        if line.startswith("{") and json.loads(line)["level"] in ("WARNING", "ERROR", "CRITICAL")
    ]
    assert any("ps-busy" in line for line in warnings), text[-3000:]
    assert not any(PAYER in line or OTHER in line for line in warnings)
