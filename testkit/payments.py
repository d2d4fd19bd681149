"""Provider deliveries for the payment tests: the providers' documented sample payloads, signed
the way each provider signs (Stripe and Standard Webhooks by their own client libraries)."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import time
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import redis
import requests
import stripe
from standardwebhooks.webhooks import Webhook

from testkit.config import SECRETS
from testkit.servers import wait_until
from webhooks.storage.live import keys
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Payment, Wallet, WebhookCall

PROVIDERS = ("paystack", "flutterwave", "monnify", "interswitch", "stripe", "standard")
SECRET = {
    "paystack": SECRETS["PAYSTACK_SECRET_KEY"],
    "flutterwave": SECRETS["FLUTTERWAVE_SECRET_HASH"],
    "monnify": SECRETS["MONNIFY_CLIENT_SECRET"],
    "interswitch": SECRETS["INTERSWITCH_SECRET"],
    "stripe": SECRETS["STRIPE_WEBHOOK_SECRET"],
    "standard": SECRETS["STANDARD_WEBHOOK_SECRET"],
}
EXPONENT = {"JPY": 0, "UGX": 0}

# Documented samples (trimmed of fields nobody reads); amount, reference, currency and e-mail
# are replaced per test.
PAYSTACK = {
    "event": "charge.success",
    "data": {
        "id": 302961,
        "domain": "live",
        "status": "success",
        "reference": "qTPrJoy9Bx",
        "amount": 10000,
        "message": None,
        "gateway_response": "Approved by Financial Institution",
        "paid_at": "2016-09-30T21:10:19.000Z",
        "created_at": "2016-09-30T21:09:56.000Z",
        "channel": "card",
        "currency": "NGN",
        "ip_address": "41.242.49.37",
        "metadata": 0,
        "fees": None,
        "customer": {
            "id": 68324,
            "first_name": "BoJack",
            "last_name": "Horseman",
            "email": "bojack@horseman.com",
            "customer_code": "CUS_qo38as2hpsgk2r0",
            "phone": None,
        },
        "authorization": {
            "authorization_code": "AUTH_f5rnfq9p",
            "bin": "539999",
            "last4": "8877",
            "exp_month": "08",
            "exp_year": "2020",
            "card_type": "mastercard DEBIT",
            "bank": "Guaranty Trust Bank",
            "country_code": "NG",
            "brand": "mastercard",
        },
        "plan": {},
    },
}
FLUTTERWAVE = {
    "event": "charge.completed",
    "data": {
        "id": 285959875,
        "tx_ref": "Links-616626414629",
        "flw_ref": "PeterEkene/FLW270177170",
        "device_fingerprint": "a42937f4a73ce8bb8b8df14e63a2df31",
        "amount": 100,
        "currency": "NGN",
        "charged_amount": 100,
        "app_fee": 1.4,
        "merchant_fee": 0,
        "processor_response": "Approved by Financial Institution",
        "auth_model": "PIN",
        "ip": "197.210.64.96",
        "narration": "CARD Transaction ",
        "status": "successful",
        "payment_type": "card",
        "created_at": "2020-07-06T19:17:04.000Z",
        "account_id": 17321,
        "customer": {
            "id": 215604089,
            "name": "Yemi Desola",
            "phone_number": None,
            "email": "user@gmail.com",
            "created_at": "2020-07-06T19:17:04.000Z",
        },
        "card": {
            "first_6digits": "123456",
            "last_4digits": "7889",
            "issuer": "VERVE FIRST CITY MONUMENT BANK PLC",
            "country": "NG",
            "type": "VERVE",
            "expiry": "02/23",
        },
    },
}
MONNIFY = {
    "eventType": "SUCCESSFUL_TRANSACTION",
    "eventData": {
        "product": {"reference": "111222333", "type": "OFFLINE_PAYMENT_AGENT"},
        "transactionReference": "MNFY|76|20211117154810|000001",
        "paymentReference": "0.01462001097368737",
        "paidOn": "17/11/2021 3:48:10 PM",
        "paymentDescription": "Mockaroo Jon",
        "metaData": {},
        "destinationAccountInformation": {},
        "paymentSourceInformation": {},
        "amountPaid": 78000,
        "totalPayable": 78000,
        "cardDetails": {},
        "paymentMethod": "CASH",
        "currency": "NGN",
        "settlementAmount": 77600,
        "paymentStatus": "PAID",
        "customer": {"name": "Mockaroo Jon", "email": "ofuzor@mailinator.com"},
    },
}
INTERSWITCH = {
    "event": "TRANSACTION.COMPLETED",
    "uuid": "c1b3a1f2-8f5b-4c8e-9d51-7a0e2f0a9b11",
    "timestamp": 1700000000000,
    "data": {
        "paymentId": 5129305,
        "transactionRef": "ISW-0001",
        "merchantReference": "ORD-0001",
        "amount": 100000,
        "currency": "NGN",
        "responseCode": "00",
        "responseDescription": "Approved by Financial Institution",
        "channel": "WEB",
        "customer": {"email": "ada@example.com", "name": "Ada"},
    },
}
STRIPE = {
    "id": "evt_3OXYZ",
    "object": "event",
    "api_version": "2024-06-20",
    "created": 1700000000,
    "livemode": False,
    "pending_webhooks": 1,
    "type": "payment_intent.succeeded",
    "request": {"id": None, "idempotency_key": None},
    "data": {
        "object": {
            "id": "pi_3OXYZ",
            "object": "payment_intent",
            "amount": 2000,
            "amount_received": 2000,
            "currency": "usd",
            "status": "succeeded",
            "receipt_email": "jenny.rosen@example.com",
            "livemode": False,
            "payment_method_types": ["card"],
        }
    },
}
STANDARD = {
    "type": "payment.succeeded",
    "timestamp": "2026-11-29T10:00:00Z",
    "data": {
        "reference": "std-0001",
        "amount_minor": 2500,
        "currency": "GHS",
        "customer": {"email": "kofi@example.com"},
    },
}

# The queue Redis of the test run (tests/conftest.py's queue_server sets it): where the
# delivery audit rows wait to be written.
QUEUE_URL: str | None = None


def _major(amount_minor: int, currency: str) -> float | int:
    exp = EXPONENT.get(currency, 2)
    return amount_minor if exp == 0 else float(Decimal(amount_minor).scaleb(-exp))


def payload(
    provider: str,
    reference: str,
    amount_minor: int,
    currency: str = "NGN",
    email: str = "ada@example.com",
    success: bool = True,
) -> dict:
    """The provider's sample event carrying this payment (a failed one when not `success`)."""
    if provider == "paystack":
        body = copy.deepcopy(PAYSTACK)
        body["data"].update(reference=reference, amount=amount_minor, currency=currency)
        body["data"]["customer"]["email"] = email
        if not success:
            body["event"], body["data"]["status"] = "charge.failed", "failed"
    elif provider == "flutterwave":
        body = copy.deepcopy(FLUTTERWAVE)
        body["data"].update(tx_ref=reference, amount=_major(amount_minor, currency), currency=currency)
        body["data"]["customer"]["email"] = email
        if not success:
            body["data"]["status"] = "failed"
    elif provider == "monnify":
        body = copy.deepcopy(MONNIFY)
        body["eventData"].update(
            transactionReference=reference, amountPaid=_major(amount_minor, currency), currency=currency
        )
        body["eventData"]["customer"]["email"] = email
        if not success:
            body["eventData"]["paymentStatus"] = "FAILED"
    elif provider == "interswitch":
        body = copy.deepcopy(INTERSWITCH)
        body["data"].update(transactionRef=reference, amount=amount_minor, currency=currency)
        body["data"]["customer"]["email"] = email
        if not success:
            body["data"]["responseCode"] = "Z1"
    elif provider == "stripe":
        body = copy.deepcopy(STRIPE)
        body["data"]["object"].update(
            id=reference,
            amount=amount_minor,
            amount_received=amount_minor,
            currency=currency.lower(),
            receipt_email=email,
        )
        if not success:
            body["type"] = "payment_intent.payment_failed"
    else:
        body = copy.deepcopy(STANDARD)
        body["data"].update(reference=reference, amount_minor=amount_minor, currency=currency)
        body["data"]["customer"]["email"] = email
        if not success:
            body["type"] = "payment.failed"
    return body


# Where each provider carries the metadata the merchant attached when it started the payment
# (API.md "Payment attribution and recovery"); Interswitch documents none.
METADATA_PATH = {
    "paystack": ("data", "metadata"),
    "flutterwave": ("data", "meta"),
    "monnify": ("eventData", "metaData"),
    "stripe": ("data", "object", "metadata"),
    "standard": ("data", "metadata"),
}


def with_metadata(provider: str, body: dict, metadata: Any) -> dict:
    """`body` with the merchant's `metadata` where `provider` carries it."""
    *parents, last = METADATA_PATH[provider]
    node = body
    for part in parents:
        node = node[part]
    node[last] = metadata
    return body


def without_payer(provider: str, body: dict) -> dict:
    """`body` with no payer e-mail at all (Stripe: receipt_email null, as its fixture has it)."""
    if provider == "stripe":
        body["data"]["object"]["receipt_email"] = None
    elif provider == "monnify":
        del body["eventData"]["customer"]["email"]
    else:
        del body["data"]["customer"]["email"]
    return body


# Refund and reversal events, from each provider's own text (docs/payments.md, "Refunds and
# reversals"): Paystack's doc snippets (refund.processed), Monnify's SDKs' RefundEventData
# (SUCCESSFUL_REFUND), a Stripe Refund object (refund.created / refund.updated /
# charge.refund.updated), and API.md's standard example. Flutterwave and Interswitch have none.
REFUND_PROVIDERS = ("paystack", "monnify", "stripe", "standard")
PAYSTACK_REFUND = {
    "event": "refund.processed",
    "data": {
        "status": "processed",
        "transaction_reference": "T2154954_412829_3be32076_6lcg3",
        "refund_reference": "132013318360",
        "amount": "5000",
        "currency": "NGN",
        "processor": "mpgs_zen",
        "customer": {"first_name": "Damilola", "last_name": "Kwabena", "email": "damilola@email.com"},
        "integration": 412829,
        "domain": "live",
    },
}
MONNIFY_REFUND = {
    "eventType": "SUCCESSFUL_REFUND",
    "eventData": {
        "merchantReason": "Order cancelled",
        "transactionReference": "MNFY|76|20211117154810|000001",
        "completedOn": "2021-11-18 10:12:40.0",
        "refundStatus": "COMPLETED",
        "customerNote": "Refund",
        "createdOn": "2021-11-18 10:11:02.0",
        "refundReference": "refund-0001",
        "refundAmount": 100.00,
    },
}
STRIPE_REFUND = {
    "id": "evt_3OXYR",
    "object": "event",
    "api_version": "2024-10-28.acacia",
    "created": 1700000100,
    "livemode": False,
    "pending_webhooks": 1,
    "type": "refund.created",
    "request": {"id": "req_1", "idempotency_key": None},
    "data": {
        "object": {
            "id": "re_3OXYZ",
            "object": "refund",
            "amount": 1000,
            "currency": "usd",
            "charge": "ch_3OXYZ",
            "payment_intent": "pi_3OXYZ",
            "reason": None,
            "status": "succeeded",
            "created": 1700000100,
        }
    },
}
STANDARD_REFUND = {
    "type": "payment.refunded",
    "data": {
        "reference": "rf_1",
        "payment_reference": "pay_1",
        "amount_minor": 2000,
        "currency": "NGN",
        "customer": {"email": "ada@example.com"},
    },
}


def refund_payload(
    provider: str,
    reference: str,
    payment_reference: str,
    amount_minor: int,
    currency: str = "NGN",
    email: str = "ada@example.com",
) -> dict:
    """The provider's documented refund event for this refund of `payment_reference`."""
    if provider == "paystack":
        body = copy.deepcopy(PAYSTACK_REFUND)
        body["data"].update(
            refund_reference=reference,
            transaction_reference=payment_reference,
            amount=str(amount_minor),
            currency=currency,
        )
        body["data"]["customer"]["email"] = email
    elif provider == "monnify":  # names neither currency nor payer: the payment's are used
        body = copy.deepcopy(MONNIFY_REFUND)
        body["eventData"].update(
            refundReference=reference,
            transactionReference=payment_reference,
            refundAmount=_major(amount_minor, currency),
        )
    elif provider == "stripe":  # no payer e-mail on a Refund
        body = copy.deepcopy(STRIPE_REFUND)
        body["data"]["object"].update(
            id=reference, payment_intent=payment_reference, amount=amount_minor, currency=currency.lower()
        )
    elif provider == "standard":
        body = copy.deepcopy(STANDARD_REFUND)
        body["data"].update(
            reference=reference, payment_reference=payment_reference, amount_minor=amount_minor, currency=currency
        )
        body["data"]["customer"]["email"] = email
    else:
        raise ValueError(f"{provider} documents no refund webhook")
    return body


def signed_headers(provider: str, raw: bytes, secret: str | None = None, at: float | None = None) -> dict:
    """The headers the provider would send with `raw`, signed with `secret` at time `at`."""
    secret = SECRET[provider] if secret is None else secret
    at = time.time() if at is None else at
    if provider == "stripe":
        return {
            "Stripe-Signature": stripe.WebhookSignature.generate_signature_header(
                raw.decode(), secret, timestamp=int(at)
            )
        }
    if provider == "standard":
        msg_id = "msg_" + uuid.uuid4().hex
        stamp = datetime.fromtimestamp(int(at), tz=timezone.utc)
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(at)),
            "webhook-signature": Webhook(secret).sign(msg_id, stamp, raw.decode()),
        }
    if provider == "flutterwave":
        return {"verif-hash": secret}
    name = {
        "paystack": "x-paystack-signature",
        "monnify": "monnify-signature",
        "interswitch": "X-Interswitch-Signature",
    }[provider]
    return {name: hmac.new(secret.encode(), raw, hashlib.sha512).hexdigest()}


def standard_v1a_headers(raw: bytes, private_key: Any, at: float | None = None) -> dict:
    """Standard Webhooks' asymmetric scheme: `v1a,<base64 ed25519 signature>` of
    "<webhook-id>.<webhook-timestamp>.<body>" (spec/standard-webhooks.md, "Signature scheme"),
    signed with a cryptography Ed25519PrivateKey."""
    stamp = str(int(time.time() if at is None else at))
    msg_id = "msg_" + uuid.uuid4().hex
    signature = private_key.sign(f"{msg_id}.{stamp}.".encode() + raw)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": stamp,
        "webhook-signature": "v1a," + base64.b64encode(signature).decode(),
    }


def whpk(private_key: Any) -> str:
    """The `whpk_` serialisation of `private_key`'s public key: base64 of its 32 raw bytes."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return "whpk_" + base64.b64encode(raw).decode()


def flutterwave_v4_headers(raw: bytes, secret: str | None = None) -> dict:
    """v4's `flutterwave-signature` as integrations compute it: base64 HMAC-SHA256 of the body
    keyed with the secret hash (docs/payments.md names the sources and their disagreement)."""
    key = (SECRET["flutterwave"] if secret is None else secret).encode()
    return {"flutterwave-signature": base64.b64encode(hmac.new(key, raw, hashlib.sha256).digest()).decode()}


def encode(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def deliver(
    target,
    provider: str,
    raw: bytes,
    headers: dict | None = None,
    session: requests.Session | None = None,
    timeout: float = 30,
) -> requests.Response:
    """POST one delivery as the provider would (signed unless `headers` are given). `target`
    is a server's base URL or a tests.conftest.Api (of a server or of the app in-process)."""
    headers = signed_headers(provider, raw) if headers is None else headers
    if isinstance(target, str):
        base = target
    else:
        base, session = target.base, session or target.http
    return (session or requests).post(
        f"{base}/v1/webhooks/{provider}",
        data=raw,
        timeout=timeout,
        headers={"Content-Type": "application/json", **headers},
    )


def balance(customer: str, currency: str) -> int | None:
    with db.connection_context():
        row = Wallet.get_or_none(Wallet.customer == customer, Wallet.currency == currency)
        return None if row is None else row.balance_minor


def write_queued_deliveries() -> int:
    """Write the audit rows of duplicate and in-flight deliveries still queued in Redis, as the
    settlement drain does (workers/settle.py write_webhook_calls), so a test reads them all."""
    from webhooks.storage.live.redis import make_store
    from workers.settle import write_webhook_calls

    if QUEUE_URL is None:
        return 0
    store = make_store(QUEUE_URL, 2)
    written = 0
    try:
        with db.connection_context():
            while done := write_webhook_calls(store, "tests"):
                written += done
        # The run's RQ worker may hold a batch it took before us: let it write it (a batch left
        # by a job that failed stays there for RQ's retry: then the rows are read as they are)
        try:
            wait_until(
                lambda: not list(store.redis.scan_iter(match=keys.webhook_calls_processing("*"))),
                timeout=10,
                what="the worker's batch of delivery rows written",
            )
        except AssertionError:
            pass
    except redis.ConnectionError:  # a test that stopped Redis: nothing can be queued there
        pass
    finally:
        store.redis.close()
    return written


def counts() -> dict[str, int]:
    write_queued_deliveries()
    with db.connection_context():
        return {
            "payments": Payment.select().count(),
            "wallets": Wallet.select().count(),
            "deliveries": WebhookCall.select().count(),
        }


def verdicts(provider: str, reference: str | None = None) -> list[str]:
    """The verdicts of the provider's deliveries in the order they arrived."""
    write_queued_deliveries()
    with db.connection_context():
        query = WebhookCall.select().where(WebhookCall.provider == provider)
        if reference is not None:
            query = query.where(WebhookCall.reference == reference)
        return [d.verdict for d in query.order_by(WebhookCall.received_at, WebhookCall.id)]


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is `pid` (the workers of a gunicorn master), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def until_answered(target, provider: str, raw: bytes, session: requests.Session | None = None) -> requests.Response:
    """Deliver as a provider does: a 409 `in_flight` is delivered again until it is answered."""
    while True:
        resp = deliver(target, provider, raw, session=session)
        if resp.status_code != 409 or resp.json().get("status") != "in_flight":
            return resp


def at_once(api, provider: str, raws: list[bytes]) -> list[dict]:
    """Deliver every body of `raws` at the same moment from threads of their own (each retried
    through 409 as a provider would); their answers, in the order of `raws`."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    start = Barrier(len(raws))

    def one(raw: bytes) -> dict:
        session = api.session()
        start.wait()
        resp = until_answered(api, provider, raw, session=session)
        return {"http": resp.status_code, **resp.json()}

    with ThreadPoolExecutor(len(raws)) as pool:
        return list(pool.map(one, raws))


def at_once_signed(api, provider: str, calls: list[tuple[bytes, dict]]) -> list[dict]:
    """As at_once, each body sent with its own headers (a scheme testkit does not sign by
    default: Standard Webhooks v1a, Flutterwave v4); retried through 409 with the same headers."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    start = Barrier(len(calls))

    def one(call: tuple[bytes, dict]) -> dict:
        raw, headers = call
        session = api.session()
        start.wait()
        while True:
            resp = deliver(api, provider, raw, headers=headers, session=session)
            if resp.status_code != 409 or resp.json().get("status") != "in_flight":
                return {"http": resp.status_code, **resp.json()}

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(one, calls))


def wallet_invariant_breaches() -> list[str]:
    """Every wallet whose balance is not its credits − refunds − disputes lost + reinstated
    (the payments' amount, refunded_minor and disputed_minor, per wallet and currency)."""
    from collections import defaultdict

    expected: dict[tuple[str, str], int] = defaultdict(int)
    with db.connection_context():
        for p in Payment.select().where(Payment.status != "unattributed"):
            expected[(p.customer, p.currency)] += p.amount_minor - p.refunded_minor - p.disputed_minor
        have = {(w.customer, w.currency): w.balance_minor for w in Wallet.select()}
    return [f"{key}: balance {have.get(key)} != {want}" for key, want in expected.items() if have.get(key, 0) != want]
