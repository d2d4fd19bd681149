"""The soak (scripts/soak, soak/run.py) for one minute at a small load: the Procfile stack
under leads and payment notifications while each of the six faults strikes once (a web worker
and the RQ worker killed -9, a buyer hung, the database cut, the scheduler killed, Redis
restarted empty), then every invariant of soak/checks.py held against the ledger, the buyers'
own records and every answer the clients got: sold <= cap per buyer and window, sold = accepted
per buyer, every accepted lead in the ledger once, every settlement written, every payment
answered 200 credited exactly once, wallets = credits minus refunds, every event delivered.

The load is small and the caps scale with it (soak/run.py buyers_config), so that they bind
within the minute; every wait of the soak is on a condition, bounded (the clients' retries,
the ledger settling), and the whole run has a time budget: past it the soak is stopped (its
processes with it) and the test fails, saying so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from soak.run import FAULTS
from testkit.servers import ROOT, mysql_admin_url

pytestmark = pytest.mark.e2e

MINUTES = 1
LEAD_RATE, PAYMENT_RATE = 15, 6  # per second: 900 leads, 360 payment deliveries
DRAIN_S = 150  # after the last send, how long a client keeps retrying (back-off up to 60 s)
SETTLE_S = 120  # then how long the ledger and the outbox each get to hold every answer
BUDGET_S = MINUTES * 60 + DRAIN_S + 2 * SETTLE_S + 180  # + the stack's set-up and the analysis
INVARIANTS = {
    "sold per buyer per window <= cap",
    "sold per buyer = accepted by its server (a repeated key once)",
    "every accepted lead in the ledger exactly once",
    "every settlement queued was settled",
    "every payment that got a 200 is credited once",
    "wallets = sum of credits minus refunds",
    "every outbox event reached the receiver",
}


def test_one_minute_soak_under_every_fault_holds_every_invariant(tmp_path):
    if not mysql_admin_url():
        pytest.skip("the soak runs on MariaDB/MySQL (FG_TEST_MYSQL), none answers")
    log = tmp_path / "soak.log"
    args = [
        *("--minutes", str(MINUTES), "--lead-rate", str(LEAD_RATE), "--payment-rate", str(PAYMENT_RATE)),
        *("--drain-seconds", str(DRAIN_S), "--settle-timeout", str(SETTLE_S)),
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "soak.run", *args],
            cwd=ROOT,
            env={**os.environ, "FG_SOAK_OUT": str(tmp_path)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            rc = proc.wait(BUDGET_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the soak stops every process it started
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            pytest.fail(f"the soak did not finish within {BUDGET_S} s:\n{log.read_text()[-4000:]}")
    output = log.read_text()
    result_file = tmp_path / f"soak-{MINUTES}m.json"
    assert result_file.exists(), f"exit status {rc}, no result:\n{output[-4000:]}"
    result = json.loads(result_file.read_text())
    checks = {c["name"]: c for c in result["checks"]}
    failed = {name: c["figures"] for name, c in checks.items() if not c["ok"]}
    assert not failed, f"{failed}\n{output[-4000:]}"
    assert set(checks) >= INVARIANTS, sorted(INVARIANTS - set(checks))
    assert rc == 0, output[-4000:]
    meta = result["meta"]
    assert [f["kind"] for f in meta["faults"]] == list(FAULTS)  # each fault struck, in turn
    assert not checks["every outbox event reached the receiver"].get("not_applicable")
    # the run proved something: leads were sold, some cap was reached and held, payments credited
    assert result["leads"]["lead_finals"].get("sold", 0) > 0
    windows = checks["sold per buyer per window <= cap"]["windows"]
    assert any(w["full"] == "yes" for w in windows), windows
    assert result["payments"]["payments_stored"] > 0
