"""Provider reconciliation (docs/api.md "Provider reconciliation: payments whose webhook never came")
against a real local HTTP server playing each provider's list API (testkit/provider_apis.py),
the real app's payment path, Redis and database: a lost webhook is credited once, a late one is
a duplicate (or a reference_conflict), webhook and reconciliation racing credit once, a failed
or truncated page credits nothing of it and the next run finishes, one run at a time."""

from __future__ import annotations

import json
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from testkit.payments import SECRET, balance, deliver, encode, payload
from testkit.provider_apis import ProviderApis
from testkit.servers import ROOT, venv_bin
from webhooks import config, services
from webhooks.payments import reconcile
from webhooks.payments.providers import notifications, payment_lists
from webhooks.payments.states import Verdict
from webhooks.storage.live import claims, keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Payment, WebhookCall

SINCE = datetime.now(timezone.utc) - timedelta(days=1)
LISTED = ("paystack", "flutterwave", "monnify", "stripe")
# provider -> (the amount as its list API sends it, in minor units, the currency it names)
AMOUNTS: dict[str, tuple[Any, int, str]] = {
    "paystack": (250050, 250050, "NGN"),
    "flutterwave": (Decimal("2500.50"), 250050, "NGN"),
    "monnify": (Decimal("2500.50"), 250050, "NGN"),
    "stripe": (250050, 250050, "usd"),
}


@pytest.fixture
def apis():
    # the Paystack API key is the webhook secret (PAYSTACK_SECRET_KEY): the run's own
    with ProviderApis(paystack_key=SECRET["paystack"], monnify_secret=SECRET["monnify"]) as server:
        yield server


def listers(apis: ProviderApis, only: tuple[str, ...] = LISTED, page_size: int = 10, **overrides: Any) -> dict:
    cfg = apis.config(**overrides)
    found = {p: lister for p, lister in payment_lists.listers(cfg).items() if p in only}
    for lister in found.values():
        lister.min_interval_s = 0
        for size in ("per_page", "size", "limit"):
            if hasattr(lister, size):
                setattr(lister, size, page_size)
    return found


def run(app, apis, only: tuple[str, ...] = LISTED, **kw) -> reconcile.Run:
    with db.connection_context():
        return reconcile.run(services.of(app).payments, listers(apis, only), SINCE, **kw)


def add(apis: ProviderApis, provider: str, reference: str, email: str = "ada@example.com", **kw) -> None:
    amount, _minor, currency = AMOUNTS[provider]
    apis.add(provider, reference, amount, email, currency=currency, **kw)


def webhook(provider: str, reference: str, minor: int | None = None) -> bytes:
    _amount, default, currency = AMOUNTS[provider]
    return encode(payload(provider, reference, minor or default, currency.upper()))


def payment(provider: str, reference: str) -> Payment:
    with db.connection_context():
        return Payment.get(Payment.provider == provider, Payment.reference == reference)


@pytest.mark.parametrize("provider", LISTED)
def test_a_lost_webhook_is_credited_once_by_reconciliation_and_the_late_one_is_a_duplicate(api, apis, provider):
    add(apis, provider, f"{provider}-lost-1")
    _amount, minor, currency = AMOUNTS[provider]
    (first,) = run(api.app, apis, (provider,)).providers
    assert (first.listed, first.recovered, first.known, first.error) == (1, 1, 0, None)
    row = payment(provider, f"{provider}-lost-1")
    assert (row.source, row.status, row.amount_minor) == ("reconciliation", "credited", minor)
    assert balance("ada@example.com", currency.upper()) == minor
    (again,) = run(api.app, apis, (provider,)).providers
    assert (again.recovered, again.known) == (0, 1)
    late = deliver(api, provider, webhook(provider, f"{provider}-lost-1"))
    assert (late.status_code, late.json()) == (200, {"status": "duplicate"})
    other = deliver(api, provider, webhook(provider, f"{provider}-lost-1", minor + 100))
    assert (other.status_code, other.json()["error"]["code"]) == (422, "reference_conflict")
    assert balance("ada@example.com", currency.upper()) == minor
    record = api.get(f"/v1/admin/payments/{provider}/{provider}-lost-1").json()
    assert record["source"] == "reconciliation"


def test_a_payment_the_webhook_credited_first_is_not_credited_again(api, apis):
    assert deliver(api, "paystack", webhook("paystack", "ps-first")).json() == {"status": "credited"}
    add(apis, "paystack", "ps-first")
    (done,) = run(api.app, apis, ("paystack",)).providers
    assert (done.listed, done.known, done.recovered) == (1, 1, 0)
    assert balance("ada@example.com", "NGN") == 250050 and payment("paystack", "ps-first").source == "webhook"


def test_webhooks_and_reconciliation_racing_on_one_payment_credit_it_once(api, apis):
    """50 at once on one reference: 25 deliveries of its webhook and 25 of the reconciliation's
    own crediting step, with the listed body, behind a barrier; exactly one credits."""
    add(apis, "paystack", "ps-race")
    hooks = services.of(api.app).payments
    (page,) = list(listers(apis, ("paystack",))["paystack"].pages(SINCE, datetime.now(timezone.utc)))
    (body,) = page.bodies
    listed = notifications.parse("paystack", body)
    start = threading.Barrier(50, timeout=60)

    def by_webhook(_: int) -> str:
        start.wait()
        resp = deliver(api, "paystack", webhook("paystack", "ps-race"))
        return resp.json()["status"]

    def by_reconciliation(_: int) -> str:
        start.wait()
        with db.connection_context():
            return str(hooks.record_found(listed, reconcile._receipt("paystack", body), None))

    with ThreadPoolExecutor(50) as pool:
        webhooks = pool.map(by_webhook, range(25))  # every call submitted now: 50 at the barrier
        found = pool.map(by_reconciliation, range(25))
        answers = list(webhooks) + list(found)
    assert answers.count(Verdict.CREDITED) == 1, answers
    assert set(answers) <= {Verdict.CREDITED, Verdict.DUPLICATE, Verdict.IN_FLIGHT}
    assert balance("ada@example.com", "NGN") == 250050
    with db.connection_context():
        assert Payment.select().count() == 1


@pytest.mark.parametrize("kind", ["500", "truncated", "dropped", "bad_envelope", "429"])
@pytest.mark.parametrize("provider", LISTED)
def test_a_page_that_fails_mid_run_credits_nothing_of_it_and_the_next_run_finishes(api, apis, provider, kind):
    for i in range(25):  # three pages of 10
        add(apis, provider, f"{provider}-mid-{i:02}", email=f"p{i}@example.com")
    apis.fail(provider, page=2, kind=kind, once=True)
    (first,) = run(api.app, apis, (provider,)).providers
    assert first.error and first.pages == 1 and first.recovered == 10
    with db.connection_context():
        assert Payment.select().count() == 10  # page 1 whole, nothing of page 2 or 3
    (second,) = run(api.app, apis, (provider,)).providers
    assert (second.error, second.pages, second.known, second.recovered) == (None, 3, 10, 15)
    _amount, minor, currency = AMOUNTS[provider]
    for i in range(25):
        assert balance(f"p{i}@example.com", currency.upper()) == minor
    with db.connection_context():
        assert Payment.select().count() == 25


def test_wrong_credentials_credit_nothing_and_say_so(api, apis):
    add(apis, "stripe", "pi_wrong")
    found = listers(apis, ("stripe",), stripe_api_key="sk_test_someone_else")
    with db.connection_context():
        (done,) = reconcile.run(services.of(api.app).payments, found, SINCE).providers
    assert done.error and done.recovered == 0
    with db.connection_context():
        assert Payment.select().count() == 0


def test_one_run_at_a_time(api, apis):
    add(apis, "paystack", "ps-lock")
    store = services.of(api.app).store
    held, _ = claims.claim(store, keys.PROVIDER_RECONCILE_LOCK, 60_000)
    assert held is not None
    done = run(api.app, apis, ("paystack",))
    assert done.busy and done.providers == [] and sum(apis.calls.values()) == 0
    claims.release(store, held)
    assert run(api.app, apis, ("paystack",)).providers[0].recovered == 1
    assert store.redis.exists(keys.PROVIDER_RECONCILE_LOCK) == 0  # released after the run


def test_a_dry_run_counts_what_is_missing_and_credits_nothing(api, apis):
    add(apis, "monnify", "MNFY|dry|1")
    (done,) = run(api.app, apis, ("monnify",), dry_run=True).providers
    assert (done.listed, done.missing, done.recovered) == (1, 1, 0)
    with db.connection_context():
        assert Payment.select().count() == 0 and WebhookCall.select().count() == 0


def test_reconciliation_attributes_and_keeps_unattributed_as_a_webhook_would(api, apis, reconfigure):
    reconfigure(payment_account_field="account_id")
    add(apis, "stripe", "pi_meta", metadata={"account_id": "acct_9"})
    add(apis, "stripe", "pi_nobody", email=None)
    (done,) = run(api.app, apis, ("stripe",)).providers
    assert done.recovered == 2
    assert balance("acct_9", "USD") == 250050
    assert payment("stripe", "pi_nobody").status == "unattributed"
    listed = api.get("/v1/admin/payments?status=unattributed").json()
    assert [(p["reference"], p["source"]) for p in listed["payments"]] == [("pi_nobody", "reconciliation")]


def test_the_cli_reconciles_says_what_is_not_and_dry_runs(base_env, apis):
    add(apis, "paystack", "ps-cli-1")
    env = {**base_env, "PAYSTACK_API_BASE": apis.url}

    def flask(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [venv_bin("flask"), "--app", "wsgi", "payments", "reconcile", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    dry = flask("--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "stripe: not reconciled (STRIPE_API_KEY unset)" in dry.stderr
    assert "interswitch: not reconciled" in dry.stderr
    (summary,) = json.loads(dry.stdout)
    assert (summary["provider"], summary["missing"], summary["recovered"]) == ("paystack", 1, 0)
    done = flask(
        "--provider",
        "paystack",
        "--since",
        (datetime.now(timezone.utc) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S"),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["recovered"] == 1 and "page 1 read" in done.stderr
    assert balance("ada@example.com", "NGN") == 250050
    refused = flask("--provider", "stripe")
    assert refused.returncode == 1 and "STRIPE_API_KEY unset" in refused.stderr
    apis.fail("paystack", page=1, kind="500")
    failed = flask()
    assert failed.returncode == 1 and "stopped early" in failed.stderr


def test_the_scheduler_runs_it_every_interval():
    from workers.schedule import periodic

    jobs = periodic(config.load({}, provider_reconcile_interval_s=120))
    assert {"func": "workers.payments.reconcile_providers", "interval": 120} in [
        {k: d[k] for k in ("func", "interval")} for d in jobs
    ]


def test_the_scheduled_job_reconciles_with_the_workers_own_backends(base_env, apis):
    """workers.payments.reconcile_providers as the RQ worker runs it: config from the
    environment, its own database connection and Redis clients."""
    add(apis, "stripe", "pi_job")
    add(apis, "paystack", "ps-job")
    env = {
        **base_env,
        "PAYSTACK_API_BASE": apis.url,
        "STRIPE_API_BASE": apis.url,
        "STRIPE_API_KEY": apis.credentials["stripe"],
    }
    done = subprocess.run(
        [venv_bin("python"), "-c", "import json, workers.payments as w; print(json.dumps(w.reconcile_providers()))"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    summary = {p["provider"]: p for p in json.loads(done.stdout.strip().splitlines()[-1])}
    assert {p: summary[p]["recovered"] for p in summary} == {"paystack": 1, "stripe": 1}
    assert balance("ada@example.com", "NGN") == 250050 and balance("ada@example.com", "USD") == 250050
    # counted where every process's samples go (PROMETHEUS_MULTIPROC_DIR), as /metrics reads them
    registry = CollectorRegistry()
    MultiProcessCollector(registry, base_env["PROMETHEUS_MULTIPROC_DIR"])
    for provider in ("paystack", "stripe"):
        labels = {"provider": provider, "what": "recovered"}
        assert registry.get_sample_value("floodgate_provider_reconcile_total", labels) >= 1
