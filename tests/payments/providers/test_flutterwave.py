"""FLUTTERWAVE_VERIFY=1: a Flutterwave payment is credited only once Flutterwave's verify
endpoint confirms it (its verif-hash is a static secret that signs nothing). A local HTTP
server plays Flutterwave's API."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from testkit.payments import balance, counts, deliver, encode, payload, verdicts, with_metadata
from testkit.provider_apis import FLUTTERWAVE_KEY, ProviderApis
from testkit.servers import free_port
from webhooks.storage.records.db import db
from webhooks.storage.records.models import AuditLog

SECRET_KEY = "FLWSECK_TEST-0123456789abcdef-X"
TX_ID = "285959875"  # data.id of Flutterwave's sample webhook (payments_helpers.FLUTTERWAVE)


class FakeFlutterwave:
    """GET /v3/transactions/<id>/verify answers `transactions[id]` (status, JSON body), as
    Flutterwave's API does; every request is kept for the test to look at."""

    def __init__(self):
        self.transactions: dict[str, tuple[int, dict]] = {}
        self.references: dict[str, tuple[int, dict]] = {}  # verify_by_reference?tx_ref=
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                outer.requests.append({"path": self.path, "authorization": self.headers.get("Authorization")})
                url = urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                found = len(parts) == 4 and parts[:2] == ["v3", "transactions"] and parts[3] == "verify"
                unknown = (404, {"status": "error", "message": "No transaction was found for this id", "data": None})
                if url.path == "/v3/transactions/verify_by_reference":
                    tx_ref = parse_qs(url.query).get("tx_ref", [""])[0]
                    status, body = outer.references.get(tx_ref, unknown)
                else:
                    status, body = outer.transactions.get(parts[2] if found else "", unknown)
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def knows(
        self,
        tx_ref: str,
        amount,
        currency="NGN",
        email="ada@example.com",
        status="successful",
        tx_id: str = TX_ID,
        http_status: int = 200,
    ) -> None:
        """Flutterwave's answer for transaction `tx_id` (the fields of its documented sample)."""
        self.transactions[tx_id] = (
            http_status,
            {
                "status": "success",
                "message": "Transaction fetched successfully",
                "data": {
                    "id": int(tx_id) if tx_id.isdigit() else tx_id,
                    "tx_ref": tx_ref,
                    "flw_ref": "FLW-MOCK-1",
                    "amount": amount,
                    "currency": currency,
                    "charged_amount": amount,
                    "status": status,
                    "payment_type": "card",
                    "customer": {"id": 1, "name": "Ada", "email": email},
                },
            },
        )

    def knows_reference(self, tx_ref: str, amount, *, tx_id: str = TX_ID, **fields) -> None:
        """verify_by_reference's answer for `tx_ref`: the same object as the verify by id
        (Flutterwave/Node-v3 documentation/transactions.md "Verify transaction with reference")."""
        self.knows(tx_ref, amount, tx_id=tx_id, **fields)
        self.references[tx_ref] = self.transactions.pop(tx_id)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def flutterwave(reconfigure):
    fake = FakeFlutterwave()
    reconfigure(flutterwave_verify=True, flutterwave_api_base=fake.url, flutterwave_secret_key=SECRET_KEY)
    yield fake
    fake.close()


def webhook(reference: str, amount_minor: int, email: str = "ada@example.com") -> bytes:
    return encode(payload("flutterwave", reference, amount_minor, "NGN", email))


def flagged() -> list[str]:
    with db.connection_context():
        return [a.entity_id for a in AuditLog.select().where(AuditLog.action == "payment.verification_failed")]


def test_a_payment_flutterwave_confirms_is_credited(api, flutterwave):
    flutterwave.knows("flw-ok", 2500)
    resp = deliver(api, "flutterwave", webhook("flw-ok", 250000))
    assert resp.json() == {"status": "credited"}, resp.text
    laps = [part.split(";")[0] for part in resp.headers["Server-Timing"].split(", ")]
    assert laps == ["verify", "parse", "dedupe", "confirm", "db_wait", "ledger", "release", "total"]
    assert balance("ada@example.com", "NGN") == 250000
    assert flutterwave.requests == [
        {"path": f"/v3/transactions/{TX_ID}/verify", "authorization": f"Bearer {SECRET_KEY}"}
    ]


@pytest.mark.parametrize(
    "what, answer",
    [
        ("another amount", {"amount": 100}),
        ("another currency", {"currency": "USD"}),
        ("another payer", {"email": "mallory@example.com"}),
        ("another tx_ref", {"tx_ref": "flw-someone-else"}),
        ("not successful", {"status": "failed"}),
        ("pending", {"status": "pending"}),
    ],
)
def test_a_webhook_flutterwave_does_not_confirm_credits_nothing_and_is_flagged(api, flutterwave, what, answer):
    flutterwave.knows(**{"tx_ref": "flw-forged", "amount": 1_000_000, **answer})
    resp = deliver(api, "flutterwave", webhook("flw-forged", 100_000_000))  # knows the static hash
    assert resp.status_code == 422, (what, resp.text)
    assert resp.json()["error"]["code"] == "verification_failed"
    assert counts()["payments"] == 0 and balance("ada@example.com", "NGN") is None
    assert verdicts("flutterwave") == ["verification_failed"] and flagged() == ["flutterwave:flw-forged"]


def test_a_transaction_flutterwave_does_not_know_credits_nothing(api, flutterwave):
    resp = deliver(api, "flutterwave", webhook("flw-invented", 5000))
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "verification_failed"
    assert counts()["payments"] == 0


def test_flutterwave_unreachable_is_503_and_its_retry_credits(api, flutterwave, reconfigure):
    reconfigure(
        flutterwave_verify=True,
        flutterwave_api_base=f"http://127.0.0.1:{free_port()}",
        flutterwave_secret_key=SECRET_KEY,
    )
    raw = webhook("flw-later", 70000)
    resp = deliver(api, "flutterwave", raw)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "unavailable"
    flutterwave.knows("flw-later", 700, http_status=503)
    reconfigure(flutterwave_verify=True, flutterwave_api_base=flutterwave.url, flutterwave_secret_key=SECRET_KEY)
    assert deliver(api, "flutterwave", raw).status_code == 503  # Flutterwave itself in trouble
    assert counts() == {"payments": 0, "wallets": 0, "deliveries": 0}  # nothing recorded: a retry
    flutterwave.knows("flw-later", 700)
    assert deliver(api, "flutterwave", raw).json() == {"status": "credited"}
    assert balance("ada@example.com", "NGN") == 70000


def test_without_flutterwave_verify_flutterwave_is_not_asked(api, flutterwave, reconfigure):
    reconfigure(flutterwave_verify=False, flutterwave_api_base=flutterwave.url)
    resp = deliver(api, "flutterwave", webhook("flw-trusted", 5000))
    assert resp.json() == {"status": "credited"}
    assert "confirm;" not in resp.headers["Server-Timing"]
    assert flutterwave.requests == []


@pytest.fixture
def provider_apis(reconfigure):
    """The provider API stand-in (testkit/provider_apis.py) answering Flutterwave's verify, with
    FLUTTERWAVE_VERIFY=1 and PAYMENT_ACCOUNT_FIELD=account_id."""
    with ProviderApis() as apis:
        reconfigure(
            flutterwave_verify=True,
            flutterwave_api_base=apis.url,
            flutterwave_secret_key=FLUTTERWAVE_KEY,
            payment_account_field="account_id",
        )
        yield apis


def account_webhook(item: dict, amount_minor: int, account: str) -> bytes:
    """Flutterwave's webhook of the transaction `item`, naming the merchant's account in meta."""
    body = with_metadata("flutterwave", payload("flutterwave", item["tx_ref"], amount_minor), {"account_id": account})
    body["data"]["id"] = item["id"]
    return encode(body)


def test_a_confirmed_payment_naming_an_account_credits_that_account(api, provider_apis):
    item = provider_apis.add("flutterwave", "flw-acct", 2500, "ada@example.com", {"account_id": "acct-7"})
    resp = deliver(api, "flutterwave", account_webhook(item, 250000, "acct-7"))
    assert resp.json() == {"status": "credited"}, resp.text  # the payer was compared with the payer
    assert balance("acct-7", "NGN") == 250000 and balance("ada@example.com", "NGN") is None
    assert len(provider_apis.requests_to(f"/v3/transactions/{item['id']}/verify")) == 1


def test_a_payment_naming_an_account_and_paid_by_another_payer_is_not_confirmed(api, provider_apis):
    item = provider_apis.add("flutterwave", "flw-acct-2", 2500, "mallory@example.com", {"account_id": "acct-7"})
    resp = deliver(api, "flutterwave", account_webhook(item, 250000, "acct-7"))  # says ada paid
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "verification_failed"
    assert balance("acct-7", "NGN") is None and flagged() == ["flutterwave:flw-acct-2"]


@pytest.mark.parametrize(
    "answer",
    [[], [{"status": "success"}], "success", 42, None, {"status": "success", "data": ["a"]}],
    ids=["empty-list", "list", "string", "number", "null", "data-list"],
)
def test_a_verify_answer_of_another_json_shape_is_503_and_its_retry_credits(api, provider_apis, answer):
    item = provider_apis.add("flutterwave", "flw-shape", 700, "ada@example.com", {"account_id": "acct-9"})
    raw = account_webhook(item, 70000, "acct-9")
    provider_apis.flutterwave_verify_answers[str(item["id"])] = answer
    resp = deliver(api, "flutterwave", raw)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "unavailable", resp.text
    assert counts() == {"payments": 0, "wallets": 0, "deliveries": 0}  # nothing recorded: a retry
    del provider_apis.flutterwave_verify_answers[str(item["id"])]
    assert deliver(api, "flutterwave", raw).json() == {"status": "credited"}
    assert balance("acct-9", "NGN") == 70000
