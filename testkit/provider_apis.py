"""A real local HTTP server playing the list APIs of Paystack, Flutterwave, Monnify and Stripe,
for the reconciliation listers (webhooks/payments/providers/payment_lists.py): from in-memory lists the test
fills, with each provider's auth check and error shape, real pagination and date filters, a
count of calls per path, and faults injected per provider and page.

    api = ProviderApis()
    api.add("paystack", "ref-1", 40333, "ada@example.com", {"wallet": "w1"})
    api.fail("paystack", page=2, kind="500", once=True)
    ... Paystack(api.url, PAYSTACK_KEY).pages(since, until) ...
    api.close()

One `api.url` serves every path: /transaction (Paystack), /v3/transactions (Flutterwave),
/api/v1/auth/login and /api/v1/transactions/search (Monnify), /v1/events (Stripe), and
Flutterwave's GET /v3/transactions/<id>/verify of an item added (FLUTTERWAVE_VERIFY). Shapes are
those docs/payments.md "Provider reconciliation" gives (the providers' SDKs, OpenAPI files and
documented samples).
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from webhooks import config
from webhooks.config import Config

PAYSTACK_KEY = "sk_test_paystack_list_key"
FLUTTERWAVE_KEY = "FLWSECK_TEST-list-0123456789-X"
MONNIFY_API_KEY = "MK_TEST_LISTKEY01"
MONNIFY_SECRET = "monnify-client-secret-list"
STRIPE_KEY = "sk_test_stripe_list_key"

PATHS = {
    "paystack": "/transaction",
    "flutterwave": "/v3/transactions",
    "monnify": "/api/v1/transactions/search",
    "stripe": "/v1/events",
}
LOGIN = "/api/v1/auth/login"
DISPUTES = "/dispute"  # Paystack's list of disputes (doc-code-snippets src/api/disputes/list)
FLUTTERWAVE_VERIFY = re.compile(r"/v3/transactions/([^/]+)/verify")
FLUTTERWAVE_PAGE_SIZE = 10  # not a parameter of its API; 10 inferred from its samples (docs/payments.md)
# kind -> what the faulty page answers; see ProviderApis.fail
KINDS = ("500", "429", "401", "truncated", "dropped", "bad_json", "bad_envelope", "trickle")
_ids = itertools.count(4099260516)


def _iso(at: datetime) -> str:
    return at.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _when(at: datetime | None) -> datetime:
    return (at or datetime.now(timezone.utc) - timedelta(minutes=5)).astimezone(timezone.utc)


def paystack_item(
    reference: str,
    amount: int,
    email: str,
    metadata: Any = None,
    currency: str = "NGN",
    *,
    status: str = "success",
    at: datetime | None = None,
    fees: int = 0,
    requested_amount: int | None = None,
) -> dict:
    """A GET /transaction item (doc-code-snippets src/api/transactions/list/response.json):
    amount in kobo; `requested_amount` below `amount` when the payer bore the fee."""
    when = _iso(_when(at))
    n = next(_ids)
    return {
        "id": n,
        "domain": "test",
        "status": status,
        "reference": reference,
        "amount": amount,
        "message": None,
        "gateway_response": "Approved" if status == "success" else "Declined",
        "paid_at": when,
        "created_at": when,
        "channel": "card",
        "currency": currency,
        "ip_address": "41.242.49.37",
        "metadata": metadata,
        "log": None,
        "fees": fees,
        "fees_split": None,
        "customer": {"id": n % 10**6, "email": email, "customer_code": f"CUS_{n}", "metadata": None},
        "authorization": {"authorization_code": f"AUTH_{n}", "bin": "408408", "last4": "4081", "brand": "visa"},
        "plan": None,
        "split": {},
        "subaccount": {},
        "order_id": None,
        "paidAt": when,
        "createdAt": when,
        "requested_amount": amount - fees if requested_amount is None else requested_amount,
        "source": None,
        "connect": None,
        "pos_transaction_data": None,
    }


def flutterwave_item(
    reference: str,
    amount: int | float | Decimal,
    email: str,
    metadata: dict | None = None,
    currency: str = "NGN",
    *,
    status: str = "successful",
    at: datetime | None = None,
    email_as: str = "customer",
) -> dict:
    """A GET /v3/transactions item (Node-v3 documentation/transactions.md): amount in major
    units; the payer's e-mail as `customer.email` (Mintlify sample) or, with
    email_as="customer_email", flat as in the Node-v3 sample."""
    n = next(_ids)
    item: dict[str, Any] = {
        "id": n,
        "tx_ref": reference,
        "flw_ref": f"FLW-MOCK-{n}",
        "device_fingerprint": "N/A",
        "amount": amount,
        "currency": currency,
        "charged_amount": amount,
        "app_fee": Decimal("1.4"),
        "merchant_fee": 0,
        "processor_response": "Approved" if status == "successful" else "Declined",
        "auth_model": "PIN",
        "ip": "197.210.64.96",
        "narration": "CARD Transaction ",
        "status": status,
        "payment_type": "card",
        "created_at": _iso(_when(at)),
        "amount_settled": amount,
        "account_id": 17321,
    }
    if email_as == "customer_email":
        item.update(customer_name="Ada Lovelace", customer_email=email)
    else:
        item["customer"] = {"id": n % 10**6, "name": "Ada Lovelace", "phone_number": "N/A", "email": email}
    if metadata is not None:
        item["meta"] = metadata
    return item


def monnify_item(
    reference: str,
    amount: int | float | Decimal,
    email: str,
    metadata: dict | None = None,
    currency: str = "NGN",
    *,
    status: str = "PAID",
    at: datetime | None = None,
    payment_reference: str | None = None,
) -> dict:
    """A GET /api/v1/transactions/search item (monnify-dotnet-lib TransactionSummary.cs, Java
    TransactionRecord.java): `reference` is Monnify's transactionReference; amounts in major
    units, named amount/payableAmount (no amountPaid), currencyCode, customerDTO."""
    when = _when(at)
    return {
        "customerDTO": {"email": email, "name": "Ada Lovelace", "merchantCode": "ALPHA"},
        "providerAmount": Decimal("0.21"),
        "paymentMethod": "ACCOUNT_TRANSFER",
        "createdOn": when.isoformat(timespec="milliseconds"),
        "amount": amount,
        "flagged": False,
        "fee": Decimal("0.79"),
        "currencyCode": currency,
        "completedOn": when.isoformat(timespec="milliseconds"),
        "paymentDescription": "wallet top-up",
        "paymentStatus": status,
        "transactionReference": reference,
        "paymentReference": payment_reference or f"pay-{reference}",
        "merchantCode": "ALPHA",
        "merchantName": "Floodgate Test",
        "payableAmount": amount,
        "completed": status == "PAID",
        "paymentMethodList": ["ACCOUNT_TRANSFER", "CARD"],
        "collectionChannel": "API_NOTIFICATION",
        "metaData": metadata or {},
    }


def stripe_event(
    reference: str,
    amount: int,
    email: str,
    metadata: dict | None = None,
    currency: str = "usd",
    *,
    at: datetime | None = None,
    type: str = "payment_intent.succeeded",
) -> dict:
    """A payment_intent.succeeded Event (stripe/openapi fixtures3.json `event`, with a
    succeeded PaymentIntent): `reference` is the PaymentIntent id, amount in minor units."""
    created = int(_when(at).timestamp())
    n = next(_ids)
    return {
        "id": f"evt_{n}",
        "object": "event",
        "api_version": "2024-06-20",
        "created": created,
        "data": {
            "object": {
                "id": reference,
                "object": "payment_intent",
                "amount": amount,
                "amount_received": amount,
                "currency": currency.lower(),
                "created": created,
                "latest_charge": f"ch_{n}",
                "metadata": metadata or {},
                "receipt_email": email,
                "status": "succeeded",
            }
        },
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": f"req_{n}", "idempotency_key": None},
        "type": type,
    }


def paystack_dispute(
    dispute_id: int,
    reference: str,
    refund_amount: int | None,
    email: str,
    *,
    status: str = "resolved",
    resolution: str | None = "merchant-accepted",
    currency: str | None = "NGN",
    at: datetime | None = None,
) -> dict:
    """A GET /dispute item (doc-code-snippets src/api/disputes/list/response.json, with the
    resolution fields of src/doc/payments/webhooks/events/charge-dispute-resolve.json)."""
    when = _iso(_when(at))
    return {
        "id": dispute_id,
        "refund_amount": refund_amount,
        "currency": currency,
        "status": status,
        "resolution": resolution,
        "domain": "test",
        "transaction": {"id": next(_ids), "status": "reversed", "reference": reference, "currency": "NGN"},
        "transaction_reference": None,
        "category": "chargeback",
        "customer": {"id": 10207, "email": email, "customer_code": "CUS_unz4q52yjsd6064"},
        "createdAt": when,
        "updatedAt": when,
    }


BUILDERS = {"paystack": paystack_item, "flutterwave": flutterwave_item, "monnify": monnify_item, "stripe": stripe_event}


@dataclass
class Fault:
    provider: str
    page: int  # 1-based, as the lister counts (Monnify's page=0 is 1; Stripe: by starting_after)
    kind: str
    once: bool


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: dict[str, str]
    authorization: str | None


def _json(value: Any) -> bytes:
    return json.dumps(value, default=lambda o: float(o) if isinstance(o, Decimal) else str(o)).encode()


class ProviderApis:
    """The four list APIs on 127.0.0.1 (see the module docstring); `close()` when done."""

    def __init__(
        self,
        paystack_key: str = PAYSTACK_KEY,
        flutterwave_key: str = FLUTTERWAVE_KEY,
        monnify_api_key: str = MONNIFY_API_KEY,
        monnify_secret: str = MONNIFY_SECRET,
        stripe_key: str = STRIPE_KEY,
    ):
        self.credentials = {
            "paystack": paystack_key,
            "flutterwave": flutterwave_key,
            "monnify_api_key": monnify_api_key,
            "monnify": monnify_secret,
            "stripe": stripe_key,
        }
        self.keys = {
            "paystack": f"Bearer {paystack_key}",
            "flutterwave": f"Bearer {flutterwave_key}",
            "stripe": f"Bearer {stripe_key}",
            "login": "Basic " + base64.b64encode(f"{monnify_api_key}:{monnify_secret}".encode()).decode(),
        }
        self.paystack: list[dict] = []
        self.flutterwave: list[dict] = []
        self.monnify: list[dict] = []
        self.stripe: list[dict] = []  # events
        self.paystack_disputes: list[dict] = []
        self.stripe_delivered: set[str] = set()  # event ids whose webhook was delivered
        # Flutterwave verify: a JSON value answered (200) instead of the documented object, per id
        self.flutterwave_verify_answers: dict[str, Any] = {}
        # Flutterwave's `status` filter is not confirmed in its docs: by default ignored here
        self.flutterwave_filters_status = False
        self.gzip = False  # pages sent with Content-Encoding: gzip (to a client that accepts it)
        self.calls: Counter[str] = Counter()  # path -> requests
        self.seen: list[Seen] = []
        self.faults: list[Fault] = []
        self.tokens: set[str] = set()  # Monnify access tokens still valid
        self.lock = threading.Lock()
        self._tokens = itertools.count(1)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def add(self, provider: str, reference: str, amount: Any, email: str, metadata: Any = None, **fields: Any) -> dict:
        """Append a realistic item (or Stripe event) built from these, and return it."""
        item = BUILDERS[provider](reference, amount, email, metadata, **fields)
        getattr(self, provider).append(item)
        return item

    def config(self, **overrides: Any) -> Config:
        """A Config naming this server's URL and keys for every provider (overridable)."""
        keys = self.credentials
        values: dict[str, Any] = {
            "paystack_api_base": self.url,
            "flutterwave_api_base": self.url,
            "monnify_api_base": self.url,
            "stripe_api_base": self.url,
            "flutterwave_secret_key": keys["flutterwave"],
            "monnify_api_key": keys["monnify_api_key"],
            "stripe_api_key": keys["stripe"],
            "secrets": {"paystack": (keys["paystack"],), "monnify": (keys["monnify"],)},
            "outbound_allow_loopback": True,  # these stand-ins listen on 127.0.0.1
        }
        return config.load({}, **{**values, **overrides})

    def fail(self, provider: str, page: int, kind: str = "500", once: bool = False) -> None:
        """Make `provider`'s page `page` answer `kind`: 500, 429 or 401 (each in the provider's
        error shape), truncated (a 200 whose JSON is cut mid-way, Content-Length matching),
        dropped (the connection closed mid-body), bad_json (a 200 HTML page), bad_envelope (a
        200 JSON object of another shape), trickle (the page sent a few bytes at a time over
        about a second). `once`: only the next request for that page."""
        assert kind in KINDS, kind
        with self.lock:
            self.faults.append(Fault(provider, page, kind, once))

    def expire_tokens(self) -> None:
        """Every Monnify access token issued so far is refused (401) from now on."""
        with self.lock:
            self.tokens.clear()

    def requests_to(self, path: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ProviderApis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fault(self, provider: str, page: int) -> str | None:
        with self.lock:
            for fault in self.faults:
                if fault.provider == provider and fault.page == page:
                    if fault.once:
                        self.faults.remove(fault)
                    return fault.kind
        return None

    # -- the four APIs: (status, body) for a request already authorized -------------------------

    def _paystack(self, q: dict[str, str]) -> tuple[int, dict, int]:
        page, per_page = int(q.get("page", 1)), int(q.get("perPage", 50))
        since, until = _parse_iso(q.get("from")), _parse_iso(q.get("to"))
        items = [
            i
            for i in self.paystack
            if q.get("status") in (None, i["status"])
            and (since is None or _parse_iso(i["created_at"]) >= since)
            and (until is None or _parse_iso(i["created_at"]) <= until)
        ]
        chunk = items[(page - 1) * per_page : page * per_page]
        meta = {
            "total": len(items),
            "total_volume": sum(i["amount"] for i in items),
            "skipped": (page - 1) * per_page,
            "perPage": per_page,
            "page": page,
            "pageCount": math.ceil(len(items) / per_page),
        }
        return 200, {"status": True, "message": "Transactions retrieved", "data": chunk, "meta": meta}, page

    def _paystack_disputes(self, q: dict[str, str]) -> tuple[int, dict, int]:
        page, per_page = int(q.get("page", 1)), int(q.get("perPage", 50))
        since, until = _parse_iso(q.get("from")), _parse_iso(q.get("to"))
        items = [
            i
            for i in self.paystack_disputes
            if (since is None or _parse_iso(i["createdAt"]) >= since)
            and (until is None or _parse_iso(i["createdAt"]) <= until)
        ]
        meta = {
            "total": len(items),
            "skipped": (page - 1) * per_page,
            "perPage": per_page,
            "page": page,
            "pageCount": math.ceil(len(items) / per_page),
        }
        chunk = items[(page - 1) * per_page : page * per_page]
        return 200, {"status": True, "message": "Disputes retrieved", "data": chunk, "meta": meta}, page

    def _flutterwave(self, q: dict[str, str]) -> tuple[int, dict, int]:
        page = int(q.get("page", 1))
        items = [
            i
            for i in self.flutterwave
            if q.get("from", "0000") <= i["created_at"][:10] <= q.get("to", "9999")
            and (not self.flutterwave_filters_status or q.get("status") in (None, i["status"]))
        ]
        size = FLUTTERWAVE_PAGE_SIZE
        info = {"total": len(items), "current_page": page, "total_pages": math.ceil(len(items) / size)}
        body = {
            "status": "success",
            "message": "Transactions fetched",
            "meta": {"page_info": info},
            "data": items[(page - 1) * size : page * size],
        }
        return 200, body, page

    def _flutterwave_verify(self, tx_id: str) -> tuple[int, Any]:
        """GET /v3/transactions/<id>/verify (Flutterwave's "Transaction verification" sample:
        the transaction, its `meta` included, under `data`); unknown: its 404 shape."""
        if tx_id in self.flutterwave_verify_answers:
            return 200, self.flutterwave_verify_answers[tx_id]
        item = next((i for i in self.flutterwave if str(i["id"]) == tx_id), None)
        if item is None:
            return 404, {"status": "error", "message": "No transaction was found for this id", "data": None}
        return 200, {"status": "success", "message": "Transaction fetched successfully", "data": item}

    def _monnify(self, q: dict[str, str]) -> tuple[int, dict, int]:
        page, size = int(q.get("page", 0)), int(q.get("size", 10))
        since, until = int(q.get("from", 0)), int(q.get("to", 2**62))
        items = [
            i
            for i in self.monnify
            if q.get("paymentStatus") in (None, i["paymentStatus"])
            and since <= datetime.fromisoformat(i["createdOn"]).timestamp() * 1000 <= until
        ]
        pages = math.ceil(len(items) / size)
        chunk = items[page * size : (page + 1) * size]
        answer = {
            "content": chunk,
            "pageable": {"pageNumber": page, "pageSize": size, "offset": page * size, "paged": True},
            "last": page >= pages - 1,
            "first": page == 0,
            "totalPages": pages,
            "totalElements": len(items),
            "number": page,
            "size": size,
            "numberOfElements": len(chunk),
            "empty": not chunk,
        }
        return (
            200,
            {"requestSuccessful": True, "responseMessage": "success", "responseCode": "0", "responseBody": answer},
            page + 1,
        )

    def _stripe(self, q: dict[str, str]) -> tuple[int, dict, int]:
        limit = int(q.get("limit", 10))
        if not 1 <= limit <= 100:
            return 400, _stripe_error("limit must be between 1 and 100", "invalid_request_error"), 0
        events = [
            e
            for e in self.stripe
            if _type_matches(q.get("type"), e["type"])
            and not (q.get("delivery_success") == "false" and e["id"] in self.stripe_delivered)
            and int(q.get("created[gte]", 0)) <= e["created"] <= int(q.get("created[lte]", 2**62))
        ]
        order = sorted(range(len(events)), key=lambda k: (events[k]["created"], k), reverse=True)
        events = [events[k] for k in order]  # newest first, as Stripe lists
        start = 0
        if "starting_after" in q:
            ids = [e["id"] for e in events]
            if q["starting_after"] not in ids:
                return 400, _stripe_error(f"No such event: '{q['starting_after']}'", "invalid_request_error"), 0
            start = ids.index(q["starting_after"]) + 1
        body = {
            "object": "list",
            "data": events[start : start + limit],
            "has_more": start + limit < len(events),
            "url": "/v1/events",
        }
        return 200, body, start // limit + 1

    def _login(self, authorization: str | None) -> tuple[int, dict]:
        if authorization != self.keys["login"]:
            return 401, {
                "requestSuccessful": False,
                "responseMessage": "Invalid client credentials",
                "responseCode": "99",
            }
        token = f"mnfy-access-{next(self._tokens)}"
        with self.lock:
            self.tokens.add(token)
        answer = {"accessToken": token, "expiresIn": 3599}
        return 200, {
            "requestSuccessful": True,
            "responseMessage": "success",
            "responseCode": "0",
            "responseBody": answer,
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._serve()

            def do_GET(self) -> None:
                self._serve()

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                authorization = self.headers.get("Authorization")
                with api.lock:
                    api.calls[parts.path] += 1
                    api.seen.append(Seen(self.command, parts.path, query, authorization))
                if (self.command, parts.path) == ("POST", LOGIN):
                    self._send(*api._login(authorization))
                    return
                verify = FLUTTERWAVE_VERIFY.fullmatch(parts.path)
                if verify and self.command == "GET":
                    if not _authorized(api, "flutterwave", authorization):
                        self._send(401, _refusal("flutterwave"))
                    else:
                        self._send(*api._flutterwave_verify(verify.group(1)))
                    return
                provider = next((p for p, path in PATHS.items() if path == parts.path), None)
                method = f"_{provider}"
                if parts.path == DISPUTES:
                    provider, method = "paystack", "_paystack_disputes"
                if provider is None or self.command != "GET":
                    self._send(404, {"message": "not found"})
                    return
                if not _authorized(api, provider, authorization):
                    self._send(401, _refusal(provider))
                    return
                status, body, page = getattr(api, method)(query)
                kind = api._fault(provider, page) if status == 200 else None
                self._answer(provider, kind, status, body)

            def _answer(self, provider: str, kind: str | None, status: int, body: dict) -> None:
                raw = _json(body)
                if kind in ("500", "429", "401"):
                    self._send(int(kind), _refusal(provider) if kind == "401" else _failure(provider, int(kind)))
                elif kind == "truncated":
                    self._send(200, raw[: len(raw) // 2])
                elif kind == "dropped":
                    self._send(200, raw[: len(raw) // 2], length=len(raw))
                elif kind == "bad_json":
                    self._send(200, b"<html><body><h1>502 Bad Gateway</h1></body></html>", ctype="text/html")
                elif kind == "bad_envelope":
                    self._send(200, {"message": "maintenance", "data": None})
                elif kind == "trickle":
                    self._send(200, raw, trickle=True)
                elif api.gzip and "gzip" in self.headers.get("Accept-Encoding", ""):
                    self._send(status, gzip.compress(raw), encoding="gzip")
                else:
                    self._send(status, raw)

            def _send(
                self,
                status: int,
                body: dict | bytes,
                ctype: str = "application/json",
                length: int | None = None,
                trickle: bool = False,
                encoding: str | None = None,
            ) -> None:
                raw = body if isinstance(body, bytes) else _json(body)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                if encoding:
                    self.send_header("Content-Encoding", encoding)
                self.send_header("Content-Length", str(len(raw) if length is None else length))
                if status == 429:
                    self.send_header("Retry-After", "60")
                self.end_headers()
                try:
                    if trickle:  # about a second in all, whatever the size
                        step = max(1, len(raw) // 20)
                        for i in range(0, len(raw), step):
                            self.wfile.write(raw[i : i + step])
                            self.wfile.flush()
                            time.sleep(0.05)
                    else:
                        self.wfile.write(raw)
                except OSError:
                    pass  # the client gave up (its deadline): nothing to finish
                if length is not None and length != len(raw):
                    self.close_connection = True

        return Handler


def _type_matches(wanted: str | None, type_: str) -> bool:
    """Stripe's `type` filter: an event name, or a group with `*` as a wildcard."""
    if wanted is None or wanted == type_:
        return True
    return wanted.endswith("*") and type_.startswith(wanted[:-1])


def _authorized(api: ProviderApis, provider: str, authorization: str | None) -> bool:
    if provider == "monnify":
        token = (authorization or "").removeprefix("Bearer ")
        with api.lock:
            return authorization is not None and authorization.startswith("Bearer ") and token in api.tokens
    return authorization == api.keys[provider]


def _parse_iso(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))


def _stripe_error(message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind}}


def _refusal(provider: str) -> dict:
    """Each provider's answer to a wrong key (401)."""
    return {
        "paystack": {"status": False, "message": "Invalid key"},
        "flutterwave": {"status": "error", "message": "Invalid authorization key", "data": None},
        "monnify": {"error": "invalid_token", "error_description": "Invalid access token"},
        "stripe": _stripe_error("Invalid API Key provided: sk_test_****", "invalid_request_error"),
    }[provider]


def _failure(provider: str, status: int) -> dict:
    """A 429 or 5xx in the provider's shape (Paystack's 429: beta.paystack.com rate-limits)."""
    message = "Rate limit exceeded!" if status == 429 else "Internal server error"
    code = "rate_limited" if status == 429 else "unknown"
    return {
        "paystack": {"status": False, "message": message, "type": "api_error", "code": code},
        "flutterwave": {"status": "error", "message": message, "data": None},
        "monnify": {"requestSuccessful": False, "responseMessage": message, "responseCode": "99"},
        "stripe": _stripe_error(message, "api_error"),
    }[provider]
