"""Operator CLI: every command as a real `flask --app wsgi ...` process against the run's
database (MariaDB when reachable) and Redis, including its error paths."""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import datetime, timezone

import pytest
import redis
from rq import Queue
from rq.registry import FailedJobRegistry

from testkit.servers import ROOT, free_port, venv_bin
from webhooks.caps import leases
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage.live import keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog, Buyer, Publisher

COMMANDS = {
    "db": ["upgrade"],
    "caps": ["reconcile"],
    "settlements": ["requeue", "status"],
    "buyers": ["export", "import", "leads", "show"],
    "publishers": ["export", "import", "trust-replay-memory"],
    "suppression": ["rehash"],
    "payments": ["reconcile"],
}
ACME = {
    "id": "acme",
    "name": "Acme Insurance",
    "endpoint_url": "http://127.0.0.1:9100/acme",
    "priority": 1,
    "price": "12.50",
    "timezone": "America/Chicago",
    "caps": {"hourly": 10, "daily": 100, "daily_budget": "900.00"},
    "states": ["TX"],
}
ZEN = {"id": "zen", "name": "Zen Leads", "endpoint_url": "http://127.0.0.1:9100/zen", "price": "9.00"}


def flask(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [venv_bin("flask"), "--app", "wsgi", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def ok(env: dict, *args: str) -> subprocess.CompletedProcess:
    done = flask(env, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def fails(env: dict, *args: str, code: int = 1) -> str:
    """Run a command that must be refused; return its "Error: ..." text."""
    done = flask(env, *args)
    assert done.returncode == code, done.stdout + done.stderr
    assert "Error:" in done.stderr and "Traceback" not in done.stderr, done.stderr
    return done.stderr


@pytest.fixture
def env(base_env) -> dict:
    """The environment of the run's web processes: its Redis and database."""
    return base_env


def write(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_every_command_has_help(env, app):
    """The listing as a real process shows; each group's and command's help through Flask's CLI
    runner in this process (help touches no state, and 17 more processes cost ~10 s)."""
    listing = ok(env, "--help").stdout
    runner = app.test_cli_runner()
    for group, commands in COMMANDS.items():
        assert group in listing
        group_help = runner.invoke(args=[group, "--help"])
        assert group_help.exit_code == 0, group_help.output
        for command in commands:
            assert command in group_help.output
            done = runner.invoke(args=[group, command, "--help"])
            assert done.exit_code == 0, done.output
            text = done.output
            assert text.startswith("Usage: ") and len(text.split("\n\n")[1].strip()) > 20, text


def test_scripts_floodgate_help_is_floodgates_own(env, tmp_path):
    done = subprocess.run(
        [str(ROOT / "scripts" / "floodgate"), "--help"],
        env={**env, "FLOODGATE_VAR": str(tmp_path)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    usage, about = done.stdout.split("\n\n")[:2]
    assert usage == "Usage: scripts/floodgate [OPTIONS] COMMAND [ARGS]..."
    assert about.strip().startswith("Floodgate's operator commands"), about
    assert "Flask" not in done.stdout and "--app" not in done.stdout, done.stdout
    assert all(group in done.stdout for group in COMMANDS)


def test_db_upgrade_is_idempotent_and_names_an_unreachable_database(env):
    assert "nothing to apply" in ok(env, "db", "upgrade").stdout
    down = {**env, "DATABASE_URL": f"mysql://root@127.0.0.1:{free_port()}/nothing"}
    assert "the database is unavailable" in fails(down, "db", "upgrade")


def test_buyers_import_validates_everything_first_and_export_reads_back(env, tmp_path, redis_server):
    r = redis_server.client()
    r.set(keys.CONFIG_VERSION, "before")
    done = ok(env, "buyers", "import", write(tmp_path, "b.json", [ACME, ZEN]))
    assert "imported 2 buyer(s) (2 new)" in done.stdout and "importing buyers" in done.stderr
    assert r.get(keys.CONFIG_VERSION) != "before"  # every web process reloads within a second
    assert r.exists(keys.ready("acme")) and r.exists(keys.ready("zen"))
    assert AuditLog.select().where(AuditLog.action == "buyer.create").count() == 2

    exported = json.loads(ok(env, "buyers", "export").stdout)
    assert [b["id"] for b in exported] == ["acme", "zen"]
    assert exported[0]["caps"] == ACME["caps"] and exported[0]["timezone"] == "America/Chicago"
    out = tmp_path / "export.json"
    ok(env, "buyers", "export", "-o", str(out))
    assert json.loads(out.read_text()) == exported
    assert "(0 new)" in ok(env, "buyers", "import", str(out)).stdout  # an export imports back as is


def test_buyers_export_imports_back_keeping_the_secrets_it_shows_redacted(env, tmp_path):
    secret_url = "http://127.0.0.1:9100/acme?api_key=sk_live_cli_secret_1"
    delivery = {"headers": {"X-Key": "abcd", "X-Api-Key": "sk_live_cli_header_secret"}}
    ok(env, "buyers", "import", write(tmp_path, "b.json", [{**ZEN, "endpoint_url": secret_url, "delivery": delivery}]))
    exported = ok(env, "buyers", "export").stdout
    assert "sk_live_cli" not in exported and "abcd" not in exported  # shown as GET shows them
    assert "(0 new)" in ok(env, "buyers", "import", write(tmp_path, "e.json", exported)).stdout
    with db.connection_context():
        row = Buyer.get_by_id("zen")
    assert row.endpoint_url == secret_url and json.loads(row.delivery)["headers"] == delivery["headers"]
    assert "endpoint_url: holds <redacted>" in fails(
        env, "buyers", "import", write(tmp_path, "new.json", [{**json.loads(exported)[0], "id": "zen-2"}])
    )


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not valid JSON"),
        ('{"id": "acme"}', "must hold a JSON list of buyers"),
        ([{"name": "no id"}], 'buyers[0]: must be an object with an "id"'),
        ([{**ZEN, "id": "bad id!"}], 'buyers[0]: must be an object with an "id"'),
        ([ZEN, ZEN], "buyers[1]: id 'zen' appears twice"),
        ([ZEN, {**ACME, "timezone": "Mars/Base"}], "buyers[1] (acme): timezone: 'Mars/Base' is not an IANA"),
        ([ZEN, {**ACME, "caps": {"hourly": -1}}], "buyers[1] (acme): caps.hourly: must be between 0"),
        ([ZEN, {**ACME, "cap": {}}], "buyers[1] (acme): cap: unknown field"),
    ],
)
def test_buyers_import_refuses_bad_input_and_saves_nothing(env, tmp_path, content, message):
    assert message in fails(env, "buyers", "import", write(tmp_path, "bad.json", content))
    assert Buyer.select().count() == 0


def test_import_of_a_missing_file_is_a_usage_error(env, tmp_path):
    assert "No such file" in fails(env, "buyers", "import", str(tmp_path / "nope.json"), code=2)


def test_publishers_export_has_no_keys_and_import_needs_them(env, tmp_path, redis_server):
    pubs = [
        {"id": "surge", "name": "Surge Media", "api_key": "pk_live_surge_0123456789", "commission_pct": "10"},
        {"id": "wave", "name": "Wave", "api_key": "pk_live_wave_0123456789", "active": False},
    ]
    assert "imported 2 publisher(s)" in ok(env, "publishers", "import", write(tmp_path, "p.json", pubs)).stdout
    # new publishers: Redis holds every answer they will be given (docs/leads.md)
    assert redis_server.client().get(keys.lead_memory("surge")) == "0"
    surge = Publisher.get_by_id("surge")
    assert surge.api_key_hash == hashlib.sha256(b"pk_live_surge_0123456789").hexdigest()
    assert not Publisher.get_by_id("wave").active

    done = ok(env, "publishers", "export")
    exported = json.loads(done.stdout)
    assert [p["id"] for p in exported] == ["surge", "wave"] and exported[0]["commission_pct"] == "10.00"
    assert all("api_key" not in p for p in exported) and exported[0]["api_key_hint"] == "…6789"
    assert "API keys are not included" in done.stderr

    error = fails(env, "publishers", "import", write(tmp_path, "export.json", exported))
    assert "publishers[0] (surge): api_key: is required" in error and "only their hash is stored" in error
    taken = [{**pubs[0], "id": "copy"}]  # the same key for another publisher
    assert "publishers[0] (copy): api_key: is already used" in fails(
        env, "publishers", "import", write(tmp_path, "taken.json", taken)
    )
    assert Publisher.select().count() == 2


def test_buyers_show_and_leads_read_caps_usage_breaker_and_the_ledger(env, tmp_path, api, worker, buyer_server):
    """A buyer imported with the CLI is live on the web side; its use and leads show up."""
    buyer_server.add("acme")
    key = api.put_publisher("pub")
    ok(env, "buyers", "import", write(tmp_path, "b.json", [{**ACME, "endpoint_url": buyer_server.url("acme")}]))
    api.settle_config()
    for i in range(2):
        assert api.post_lead(key, {"lead_id": f"cli-{i}", "state": "TX"}).json()["status"] == "sold"
    api.wait_settled("cli-1", "pub")

    shown = ok(env, "buyers", "show", "acme").stdout
    assert "acme: Acme Insurance (active), price 12.50" in shown and "breaker: closed" in shown
    rows = {line.split()[0]: line.split()[1:] for line in shown.splitlines()[2:]}
    assert rows["hourly"][1:] == ["2", "10"] and rows["daily_budget"][1:] == ["25.00", "900.00"]

    header, *lines = ok(env, "buyers", "leads", "acme").stdout.splitlines()
    assert header.split()[:3] == ["received", "(UTC)", "publisher"]
    assert [line.split()[2] for line in lines] == ["cli-1", "cli-0"]  # newest first
    cols = lines[0].split()
    assert cols[1:4] == ["pub", "cli-1", "accepted"] and cols[5:] == ["sold", "acme", "12.50"]
    assert len(ok(env, "buyers", "leads", "acme", "--limit", "1").stdout.splitlines()) == 2


def test_a_billed_buyer_imported_from_the_cli_is_sold_to_at_once(env, tmp_path, api, buyer_server):
    """The import saves a buyer as the admin API does: a billed one's balance known to Redis
    before any process sees it billed, so its first lead sells without waiting for a rebuild."""
    buyer_server.add("acme")
    key = api.put_publisher("pub")
    credit = {"mode": "credit", "account": "acme-books", "currency": "NGN", "credit_limit": "25.00"}
    billed = {**ACME, "endpoint_url": buyer_server.url("acme"), "billing": credit}
    ok(env, "buyers", "import", write(tmp_path, "b.json", [billed]))
    api.settle_config()
    balance = api.get("/v1/admin/buyers/acme").json()["balance"]
    assert balance["available"] == "25.00", balance  # known to Redis, not left to a rebuild
    answer = api.post_lead(key, {"lead_id": "billed-0", "state": "TX"}).json()
    assert answer.get("status") == "sold", answer


def test_buyers_show_and_leads_refuse_unknown_or_malformed_ids(env, tmp_path):
    ok(env, "buyers", "import", write(tmp_path, "b.json", [ZEN]))
    assert "no buyer 'nope'" in fails(env, "buyers", "show", "nope")
    assert "no buyer 'nope'" in fails(env, "buyers", "leads", "nope")
    assert "must match" in fails(env, "buyers", "show", "bad id!", code=2)
    assert "1<=x<=1000" in fails(env, "buyers", "leads", "zen", "--limit", "0", code=2)
    assert "no leads offered to 'zen'" in ok(env, "buyers", "leads", "zen").stdout
    assert "caps: none (unlimited)" in ok(env, "buyers", "show", "zen").stdout
    down = {**env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    assert "Redis is unavailable" in fails(down, "buyers", "show", "zen")


def test_caps_reconcile_corrects_a_drifted_counter(env, tmp_path, redis_server):
    ok(env, "buyers", "import", write(tmp_path, "b.json", [ACME]))
    rule = BuyerRule.from_row(Buyer.get_by_id("acme"))
    for _ in range(2):  # again once when an hour began while it ran: it reconciled the new window
        window = leases.windows(rule, datetime.now(timezone.utc))[0][2]
        redis_server.client().set(leases.counter_key("acme", window), 7)
        out = ok(env, "caps", "reconcile").stdout
        if leases.windows(rule, datetime.now(timezone.utc))[0][2] == window:
            break
    assert "acme hourly" in out and "counter 7 -> 0" in out and "1 drift(s) corrected" in out
    assert "0 drift(s) corrected" in ok(env, "caps", "reconcile").stdout
    assert "Redis is unavailable" in fails(
        {**env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, "caps", "reconcile"
    )


def test_settlements_status_and_requeue_of_failed_jobs(env, redis_server):
    q = Queue("floodgate", connection=redis.Redis(port=redis_server.port))
    registry = FailedJobRegistry(queue=q)
    job = q.enqueue("workers.settle.drain")
    q.remove(job)
    registry.add(job, exc_string="database down")
    failed = registry.count

    status = json.loads(ok(env, "settlements", "status").stdout)
    assert set(status) == {"pending_settlements", "queued_jobs", "running_jobs", "failed_jobs"}
    assert status["failed_jobs"] == failed >= 1
    done = ok(env, "settlements", "requeue")
    assert f"requeued {failed} job(s) on floodgate" in done.stdout and "requeueing" in done.stderr
    assert registry.count == 0
    assert "Redis is unavailable" in fails(
        {**env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, "settlements", "status"
    )


def test_trust_replay_memory_marks_publishers_without_a_mark(env, redis_server):
    """An upgrade: publishers made before the memory mark existed would read the ledger for a
    week; the command marks them, and keeps a mark a data loss left unless --force."""
    with db.connection_context():
        for pid in ("old-a", "old-b"):
            Publisher.create(id=pid, name=pid, api_key_hash=pid.ljust(64, "0"), api_key_hint="0000", commission_pct=0)
    r = redis_server.client()
    r.set(keys.lead_memory("old-b"), "1796000000000")  # Redis lost its data at that time
    assert "1 of 2 publisher(s) marked" in ok(env, "publishers", "trust-replay-memory").stdout
    assert (r.get(keys.lead_memory("old-a")), r.get(keys.lead_memory("old-b"))) == ("0", "1796000000000")
    assert "2 of 2 publisher(s) marked" in ok(env, "publishers", "trust-replay-memory", "--force").stdout
    assert r.get(keys.lead_memory("old-b")) == "0"
