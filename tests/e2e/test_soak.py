"""The soak (scripts/soak, soak/run.py) for one minute at a small load: the Procfile stack
under leads and payment notifications while each of the seven faults strikes once (a web
worker, the RQ worker and the Galera node HAProxy writes to killed -9, a buyer hung, the
database cut, the scheduler killed, Redis restarted empty), then every invariant of
soak/checks.py held against the ledger, the buyers' own records and every answer the clients
got: sold <= cap per buyer and window, sold = accepted per buyer, every accepted lead in the
ledger once, every settlement written, every payment answered 200 credited exactly once,
wallets = credits minus refunds, every event delivered.

The ledger is a 3-node Galera cluster behind HAProxy (`--galera`, testkit/galera.py), as issue
66 asks of the soak: the writer's death is then one of the faults, and it must have moved
HAProxy to a backup, sold and credited through it, and rejoined. Rather than a second soak
test (about 95 s more), the one run takes the cluster: it costs the cluster's start and the
node's rejoin, about 20 s. On a machine without Debian's galera-4 the soak runs on the local
MariaDB alone, without that fault.

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
from testkit.galera import PROVIDER
from testkit.servers import ROOT, mysql_admin_url

pytestmark = pytest.mark.e2e

MINUTES = 1
GALERA = os.path.exists(PROVIDER)
LEAD_RATE, PAYMENT_RATE = 15, 6  # per second: 900 leads, 360 payment deliveries
DRAIN_S = 150  # after the last send, how long a client keeps retrying (back-off up to 60 s)
SETTLE_S = 120  # then how long the ledger and the outbox each get to hold every answer
BUDGET_S = MINUTES * 60 + DRAIN_S + 2 * SETTLE_S + 180 + GALERA * 120  # + set-up (the cluster's), analysis
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
        *(["--galera"] if GALERA else []),
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
    result_file = tmp_path / f"soak-{MINUTES}m{'-galera' if GALERA else ''}.json"
    assert result_file.exists(), f"exit status {rc}, no result:\n{output[-4000:]}"
    result = json.loads(result_file.read_text())
    checks = {c["name"]: c for c in result["checks"]}
    failed = {name: c["figures"] for name, c in checks.items() if not c["ok"]}
    assert not failed, f"{failed}\n{output[-4000:]}"
    assert set(checks) >= INVARIANTS, sorted(INVARIANTS - set(checks))
    assert rc == 0, output[-4000:]
    meta = result["meta"]
    # each fault struck, in turn
    assert [f["kind"] for f in meta["faults"]] == [k for k in FAULTS if GALERA or k != "writer_kill"]
    if GALERA:  # HAProxy moved, a lead settled and a payment was credited through the new writer, the node rejoined
        (writer_kill,) = [f for f in meta["faults"] if f["kind"] == "writer_kill"]
        assert all(writer_kill["milestones"].get(m) is not None for m in ("moved", "healed", "rejoined")), writer_kill
    assert not checks["every outbox event reached the receiver"].get("not_applicable")
    # the run proved something: leads were sold, some cap was reached and held, payments credited
    assert result["leads"]["lead_finals"].get("sold", 0) > 0
    windows = checks["sold per buyer per window <= cap"]["windows"]
    assert any(w["full"] == "yes" for w in windows), windows
    assert result["payments"]["payments_stored"] > 0
