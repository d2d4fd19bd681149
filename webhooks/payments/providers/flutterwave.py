"""Flutterwave's re-check of a payment before it is credited (FLUTTERWAVE_VERIFY=1): its v3
`verif-hash` is a static secret that signs nothing, so the payment is confirmed with
`GET /v3/transactions/<data.id>/verify`, as Flutterwave's guidance and its Node-v3 SDK do, and
credited only when Flutterwave's answer matches the webhook. Sources and the matched fields:
docs/payments.md "What each scheme is based on"."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote, urlencode

from webhooks import outbound
from webhooks.errors import InvalidJSON, InvalidPayload, NotConfirmed, Unavailable
from webhooks.formats import money, strictjson
from webhooks.payments.providers.listing import dumps
from webhooks.payments.providers.notifications import PaymentNotification

log = logging.getLogger(__name__)

TIMEOUT_S = 10  # well inside PAYMENT_CLAIM_TTL_MS: the claim is held meanwhile
_client = outbound.Client(pool_size=8)


def confirm(note: PaymentNotification, api_base: str, secret_key: str, timeout_s: float = TIMEOUT_S) -> None:
    """Return when Flutterwave confirms `note`; NotConfirmed (422) when it does not, or
    Unavailable (503: the provider retries later) when it cannot be asked or its answer is not
    the documented object (a list, a bare value, another envelope: never a 500)."""
    if not note.transaction_id:
        raise NotConfirmed("the notification has no data.id to verify with Flutterwave")
    status, content = fetch_verification(api_base, note.transaction_id, secret_key, timeout_s)
    body = _documented(status, content, note.reference)
    if body is None:
        raise NotConfirmed(f"Flutterwave knows no transaction {note.transaction_id}")
    problem = _disagreement(note, body.get("status"), body.get("data"))
    if problem:
        log.warning("Flutterwave does not confirm %s: %s", note.reference, problem)
        raise NotConfirmed(f"Flutterwave does not confirm this payment: {problem}; nothing credited")


def by_reference(tx_ref: str, api_base: str, secret_key: str, timeout_s: float = TIMEOUT_S) -> bytes | None:
    """The v3 charge.completed webhook body of the successful transaction Flutterwave's
    `GET /v3/transactions/verify_by_reference?tx_ref=` answers for `tx_ref` (Flutterwave/Node-v3
    services/transactions/rave.verify-by-txref.js); None when Flutterwave knows no successful
    transaction of that reference; Unavailable (503) when it cannot be asked or answers
    something other than its documented object."""
    url = f"{api_base.rstrip('/')}/v3/transactions/verify_by_reference?{urlencode({'tx_ref': tx_ref})}"
    status, content = _get(url, secret_key, timeout_s)
    body = _documented(status, content, tx_ref)
    data = None if body is None else body.get("data")
    if body is None or body.get("status") != "success" or not isinstance(data, dict):
        return None
    if data.get("status") != "successful" or data.get("tx_ref") != tx_ref:
        return None
    return dumps({"event": "charge.completed", "data": data})


def fetch_verification(api_base: str, transaction_id: str, secret_key: str, timeout_s: float) -> tuple[int, bytes]:
    """(HTTP status, body) of GET /v3/transactions/<id>/verify through the one outbound path
    (a total deadline, 64 KiB of answer at most); Unavailable when no whole answer came."""
    url = f"{api_base.rstrip('/')}/v3/transactions/{quote(transaction_id, safe='')}/verify"
    return _get(url, secret_key, timeout_s)


def _get(url: str, secret_key: str, timeout_s: float) -> tuple[int, bytes]:
    reply = _client.request(
        "GET",
        url,
        headers={"Authorization": f"Bearer {secret_key}", "Accept": "application/json"},
        deadline_s=timeout_s,
    )
    if reply.failure is not None or reply.truncated:
        why = "answered more than 64 KiB" if reply.truncated else f"did not answer ({reply.failure})"
        raise Unavailable(f"Flutterwave's verify endpoint {why}; nothing credited, retry later")
    return reply.status, reply.body


def _documented(status: int, content: bytes, reference: str | None) -> dict[str, Any] | None:
    """A verify endpoint's answer as its documented object (`status`, and `data` an object when
    `status` is "success"); None when Flutterwave knows no such transaction (400, 404);
    Unavailable (503: the provider retries later) for any other status, no JSON or another
    shape: never the payer's fault, and never a 500."""
    if status in (400, 404):
        return None
    if status != 200:
        # 401/403: our FLUTTERWAVE_SECRET_KEY is wrong; 429/5xx: theirs
        log.error("Flutterwave's verify endpoint answered %s for %s", status, reference)
        raise Unavailable(f"Flutterwave's verify endpoint answered {status}; nothing credited, retry later")
    try:
        body = strictjson.loads(content, decimals=True)
    except InvalidJSON:
        raise Unavailable("Flutterwave's verify endpoint answered no JSON; nothing credited, retry later") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(body, dict) or (body.get("status") == "success" and not isinstance(data, dict)):
        log.error("Flutterwave's verify endpoint answered JSON of another shape for %s", reference)
        raise Unavailable("Flutterwave's verify endpoint answered JSON of another shape; nothing credited, retry later")
    return body


def _disagreement(note: PaymentNotification, status: Any, data: Any) -> str | None:
    """What in Flutterwave's answer (its `status` and `data`) differs from the webhook, or None
    when all agrees. The payer is compared with the payer: the webhook's `data.customer.email`,
    not the wallet (which is the merchant's account id when PAYMENT_ACCOUNT_FIELD names one)."""
    if status != "success" or not isinstance(data, dict):
        return "no transaction in the answer"
    if data.get("status") != "successful":
        return f"its status is {str(data.get('status'))[:32]!r}"
    if str(data.get("id")) != note.transaction_id or str(data.get("tx_ref")) != note.reference:
        return "another transaction id or tx_ref"
    try:
        code = money.currency(data.get("currency"))
        amount = money.to_minor(data.get("amount"), code, major=True)
    except InvalidPayload:
        return "no usable amount or currency"
    if (amount, code) != (note.amount_minor, note.currency):
        return "another amount or currency"
    customer = data.get("customer")
    email = customer.get("email") if isinstance(customer, dict) else None
    if (email.strip().lower() if isinstance(email, str) else None) != note.payer:
        return "another payer"
    return None
