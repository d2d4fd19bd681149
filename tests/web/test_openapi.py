"""GET /openapi.json: a valid OpenAPI 3 description of every route in docs/api.md, kept honest by
schemathesis against the live app under gunicorn (no 5xx, no answer outside the contract)."""

from __future__ import annotations

import re
import subprocess
from datetime import datetime, timezone
from decimal import Decimal

import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from schemathesis.checks import (
    content_type_conformance,
    ignored_auth,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from testkit.servers import ROOT, venv_bin
from tests.conftest import ADMIN_TOKEN
from webhooks.caps import leases
from webhooks.leads.accounting import ledger
from webhooks.leads.path import settlement
from webhooks.leads.path.routing import Outcome
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.storage.live import keys
from webhooks.storage.records.db import db

PUBLISHER_KEY = "pk_test_openapi_0123456789"
MAX_EXAMPLES = 25  # per operation and phase: the whole run stays well under a minute
# Every route of docs/api.md's tables, as "METHOD path" of the description.
CONTRACT = {
    "PUT /v1/admin/publishers/{publisher_id}",
    "GET /v1/admin/publishers/{publisher_id}",
    "PUT /v1/admin/buyers/{buyer_id}",
    "GET /v1/admin/buyers/{buyer_id}",
    "DELETE /v1/admin/buyers/{buyer_id}",
    "GET /v1/admin/leads/{lead_id}",
    "GET /v1/admin/wallets/{customer}",
    "GET /v1/admin/payments/{provider}/{reference}",
    "POST /v1/leads",
    "POST /v1/leads/check",
    "POST /v1/webhooks/{provider}",
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
    "GET /openapi.json",
    "GET /ops",
    "GET /ops/rq",
    "GET /ops/rq/",
    "POST /v1/admin/leads/{lead_id}/return",
    "POST /v1/admin/returns/{return_id}/approve",
    "POST /v1/admin/returns/{return_id}/reject",
    "GET /ops/returns",
    "POST /ops/returns/{return_id}/approve",
    "POST /ops/returns/{return_id}/reject",
    "DELETE /v1/admin/leads/{lead_id}/personal-data",
    "GET /v1/admin/webhooks/ignored",
    "POST /v1/admin/buyers/{buyer_id}/preview",
    "POST /v1/admin/buyers/{buyer_id}/api-key",
    "GET /v1/buyer/leads",
    "POST /v1/buyer/returns",
    "POST /v1/buyer/feedback",
    "GET /v1/admin/buyers/{buyer_id}/statement",
    "GET /v1/admin/publishers/{publisher_id}/statement",
    "GET /v1/admin/payment-events",
    "GET /v1/admin/event-endpoints",
    "PUT /v1/admin/event-endpoints/{endpoint_id}",
    "GET /v1/admin/event-endpoints/{endpoint_id}",
    "DELETE /v1/admin/event-endpoints/{endpoint_id}",
    "POST /v1/admin/event-endpoints/{endpoint_id}/replay",
    "GET /v1/admin/events",
    "GET /v1/admin/events/{event_id}",
    "GET /v1/admin/payments",
    "GET /v1/admin/reports/leads",
    "GET /v1/admin/buyers",
    "GET /v1/admin/publishers",
    "GET /v1/admin/leads",
    "POST /v1/admin/payments/{provider}/{reference}/assign",
    "GET /v1/admin/webhooks/rejected",
    "POST /ops/logout",
    "GET /ops/reports/leads.csv",
    "GET /ops/logged-out",
    "GET /ops/login",
    "POST /ops/login",
    "GET /ops/buyers",
    "POST /ops/buyers",
    "GET /ops/buyers/new",
    "GET /ops/buyers/{buyer_id}",
    "POST /ops/buyers/{buyer_id}",
    "POST /ops/buyers/{buyer_id}/pause",
    "POST /ops/buyers/{buyer_id}/resume",
    "GET /ops/buyers/{buyer_id}/statement.csv",
    "GET /ops/publishers/{publisher_id}/statement.csv",
    "GET /ops/publishers",
    "POST /ops/publishers",
    "GET /ops/publishers/new",
    "GET /ops/publishers/{publisher_id}",
    "POST /ops/publishers/{publisher_id}",
    "POST /ops/publishers/{publisher_id}/key",
    "POST /ops/publishers/{publisher_id}/pause",
    "POST /ops/publishers/{publisher_id}/resume",
    "GET /ops/leads",
    "GET /ops/leads.csv",
    "POST /ops/leads/return",
    "GET /ops/leads/{lead_id}",
    "POST /ops/leads/{lead_id}/return",
    "GET /ops/payments",
    "POST /ops/payments/{provider}/{reference}/assign",
    "GET /ops/events",
    "POST /ops/events/retry",
    "POST /ops/events/{endpoint_id}/replay",
    "GET /ops/reports",
    "GET /ops/audit",
    "GET /ops/suppression",
    "POST /ops/suppression",
    "GET /ops/suppression/{list_id}",
    "POST /ops/suppression/{list_id}/entries",
    "POST /ops/suppression/{list_id}/upload",
    "GET /ops/payments.csv",
    "GET /ops/payments/wallet",
    "POST /ops/events/endpoints",
    "GET /ops/events/endpoints/{endpoint_id}",
    "POST /ops/events/endpoints/{endpoint_id}",
    "POST /ops/events/endpoints/{endpoint_id}/pause",
    "POST /ops/events/endpoints/{endpoint_id}/resume",
    "POST /ops/events/endpoints/{endpoint_id}/rotate",
    "POST /ops/buyers/{buyer_id}/test-lead",
    "POST /ops/selected-buyers",
    "GET /v1/admin/suppression-lists",
    "PUT /v1/admin/suppression-lists/{list_id}",
    "GET /v1/admin/suppression-lists/{list_id}",
    "POST /v1/admin/suppression-lists/{list_id}/entries",
    "PATCH /v1/admin/publishers/{publisher_id}",
    "PATCH /v1/admin/buyers/{buyer_id}",
    # operator users (the users branch) and the buyer and publisher portals
    "POST /v1/admin/users",
    "GET /v1/admin/users",
    "GET /v1/admin/users/{user_id}",
    "DELETE /v1/admin/users/{user_id}",
    "GET /ops/setup/{token}",
    "POST /ops/setup/{token}",
    "GET /ops/users",
    "POST /ops/users",
    "POST /ops/users/{user_id}/deactivate",
    "GET /portal",
    "GET /portal/login",
    "POST /portal/login",
    "POST /portal/logout",
    "GET /portal/buyer",
    "POST /portal/buyer/key",
    "GET /portal/buyer/sales",
    "GET /portal/buyer/sales.csv",
    "GET /portal/buyer/sales/{publisher_id}/{lead_id}",
    "POST /portal/buyer/sales/{publisher_id}/{lead_id}/return",
    "POST /portal/buyer/sales/{publisher_id}/{lead_id}/feedback",
    "GET /portal/buyer/statement",
    "GET /portal/buyer/statement.csv",
    "GET /portal/publisher",
    "POST /portal/publisher/key",
    "GET /portal/publisher/leads",
    "GET /portal/publisher/leads/{lead_id}",
    "GET /portal/publisher/statement",
    "GET /portal/publisher/statement.csv",
}
LIMIT_REQUEST_LINE = 4094  # gunicorn's default, which gunicorn.conf.py keeps


@schemathesis.check
def documented_status_or_server_refusal(ctx, response, case) -> bool | None:
    """`status_code_conformance`, but a 414 is what the HTTP server answers itself, before any
    operation sees the request, for a request line over its limit (the description's own
    `info`: every operation can get it): a generated query of a few KB is refused so. It must
    be that refusal: the line really over the limit and the documented JSON error."""
    if response.status_code == 414:
        line = f"{response.request.method} {response.request.path_url} HTTP/1.1"
        assert len(line.encode()) > LIMIT_REQUEST_LINE, f"414 for a request line of {len(line)} bytes"
        assert response.json()["error"]["code"] == "uri_too_long"
        return None
    return status_code_conformance(ctx, response, case)


CHECKS = [
    not_a_server_error,
    documented_status_or_server_refusal,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    ignored_auth,
]


def _spec(web) -> dict:
    resp = requests.get(web.url + "/openapi.json", timeout=10)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == "application/json"
    return resp.json()


def test_spec_is_valid_openapi_and_describes_every_route(web):
    spec = _spec(web)
    validate(spec)  # raises on an invalid document
    described = {
        f"{method.upper()} {path}"
        for path, item in spec["paths"].items()
        for method in item
        if method in ("get", "put", "post", "delete", "patch")
    }
    assert described == CONTRACT
    schemes = spec["components"]["securitySchemes"]
    assert schemes["adminBearer"]["scheme"] == schemes["publisherBearer"]["scheme"] == "bearer"
    assert spec["components"]["schemas"]["Id"]["pattern"] == "^[A-Za-z0-9._-]{1,64}$"


def test_every_route_of_the_app_is_described(web, base_env):
    """The other direction: every route `flask routes` lists is described (but the dashboard's
    own pages and files under /ops/rq/, and Flask's static files)."""
    spec_paths = {re.sub(r"\{(\w+)\}", r"<\1>", p) for p in _spec(web)["paths"]}
    out = subprocess.run(
        [venv_bin("flask"), "--app", "wsgi", "routes"],
        env=base_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rules = [line.split()[-1] for line in out.splitlines()[2:] if line.strip()]
    assert "/v1/leads" in rules
    for rule in rules:
        if rule.startswith(("/static/", "/ops/rq/")):
            continue
        assert re.sub(r"<(?:\w+:)?(\w+)>", r"<\1>", rule) in spec_paths, rule


SPEC = yaml.safe_load((ROOT / "webhooks" / "web" / "openapi.yaml").read_text(encoding="utf-8"))
# Loaded from the file the app serves (test_spec_served_is_the_file checks they agree): the
# fixture-based loader of schemathesis 4.32 does not run under pytest 9.
# The console's forms are left out of the fuzz: each goes through the admin route's own
# validation, fuzzed here (a generated buyer made by a form would get the fuzzed leads at a
# generated address, and generated logins would lock this address out); the fast tier tests
# them (tests/web/ops/).
schema = schemathesis.openapi.from_dict(SPEC).exclude(tag="console-forms")
schema.config.generation.update(max_examples=MAX_EXAMPLES)


def test_spec_served_is_the_file(web):
    assert _spec(web) == SPEC


@pytest.fixture
def configured(api, buyer_server) -> str:
    """A publisher and a buyer, so that generated leads are routed and sold; a sale of the
    buyer's in the ledger, and the buyer's API key (returned), for the buyer API's routes."""
    api.put_publisher("openapi", api_key=PUBLISHER_KEY)
    buyer_server.add("fuzzed")
    api.put_buyer("fuzzed", buyer_server.url("fuzzed"), caps={"hourly": 1000})
    api.settle_config()
    now = datetime.now(timezone.utc)
    outcome = Outcome(
        status="sold", buyer_id="fuzzed", price=Decimal("10.00"), sold_at=now, lease=leases.Lease("fuzzed", "l", ())
    )
    publisher = PublisherRule(id="openapi", active=True, payout_pct=Decimal("10"))
    item = settlement.make_item(
        publisher=publisher, lead_id="fuzz-sold", outcome=outcome, payload="{}", received_at=now, request_id=None
    )
    with db.connection_context():
        ledger.settle([item])
    resp = api.http.post(f"{api.base}/v1/admin/buyers/fuzzed/api-key", headers=api.admin)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["api_key"])


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_live_app_honours_its_description(case, web, configured, buyer_server, redis_server):
    # ignored_auth probes each operation with wrong tokens from the address of the other calls:
    # each example starts with that address' tries of the admin token (webhooks/web/logins.py)
    redis_server.delete_keys(keys.ops_login_failures("*"))
    redis_server.delete_keys(keys.buyer_key_failures("*"))  # and of buyer keys, on /v1/buyer/*
    path = case.operation.path
    if path.startswith(("/v1/admin", "/ops")):
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    elif path in ("/v1/leads", "/v1/leads/check"):
        headers = {"Authorization": f"Bearer {PUBLISHER_KEY}"}
    elif path.startswith("/v1/buyer/"):
        headers = {"Authorization": f"Bearer {configured}"}
    else:
        headers = {}
    if (
        path == "/v1/admin/buyers/{buyer_id}"
        and isinstance(case.body, dict)
        and isinstance(case.body.get("endpoint_url"), str)
    ):
        # A generated buyer that is accepted gets leads: keep every delivery on this machine.
        case.body["endpoint_url"] = buyer_server.url("fuzzed")
    case.call_and_validate(base_url=web.url, headers=headers, checks=CHECKS, timeout=30)
