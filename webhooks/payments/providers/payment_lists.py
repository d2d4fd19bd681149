"""Each provider's list of successful payments, page by page, as the JSON body its webhook would
carry, so `notifications.parse` reads both. A page is fetched under a time and size budget, paced
under the provider's rate limit, and validated whole before it is yielded (else ProviderError,
nothing of it yielded). Sources: per provider below, and docs/payments.md "Provider
reconciliation"."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from webhooks.config import Config
from webhooks.payments.providers.listing import (
    Calls,
    HttpLister,
    Lister,
    Page,
    ProviderError,
    count,
    dumps,
    objects,
)

log = logging.getLogger(__name__)


class Paystack(HttpLister):
    """GET /transaction, offset pages (PaystackOSS/openapi dist/paystack.yaml `/transaction`;
    doc-code-snippets src/api/transactions/list and src/api/pagination/offset-metadata). The
    page size's wire name is `perPage` (paystack.com/docs/api/pagination, paystack-python
    transaction_.py), not the spec's `per_page`. Rate limit: live 600 requests / 60 s
    (beta.paystack.com/docs/api/rate-limits): 0.1 s apart."""

    provider = "paystack"
    min_interval_s = 0.1
    per_page = 100

    def _pages(self, calls: Calls, since: datetime, until: datetime) -> Iterator[Page]:
        params = {"status": "success", "from": _iso(since), "to": _iso(until), "perPage": self.per_page}
        for number in self._numbers():
            body = calls.json(number, "GET", f"{self.base}/transaction", self._headers, {**params, "page": number})
            items, page_count = self._check(body, number)
            # a list item is the `data` of a charge.success webhook (doc-code-snippets samples)
            bodies = [dumps({"event": "charge.success", "data": i}) for i in items if i.get("status") == "success"]
            yield calls.page(number, bodies)
            if number >= page_count:
                return

    def _check(self, body: Any, number: int) -> tuple[list[dict[str, Any]], int]:
        if not isinstance(body, dict) or body.get("status") is not True:
            raise self.error(number, "the answer's status is not true")
        items, meta = objects(body.get("data")), body.get("meta")
        if items is None or not isinstance(meta, dict):
            raise self.error(number, "no data list of transactions, or no meta")
        page, page_count = count(meta.get("page")), count(meta.get("pageCount"))
        if page != number or page_count is None or len(items) > self.per_page:
            raise self.error(number, "meta.page / meta.pageCount missing or not this page's")
        return items, page_count


def _iso(moment: datetime) -> str:
    """ISO 8601 in UTC with a Z, as Paystack's examples write it (2016-09-24T00:00:05.000Z)."""
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Flutterwave(HttpLister):
    """GET /v3/transactions (Flutterwave/Node-v3 documentation/transactions.md; Java-v3
    bean/PageInfo.java; the v3 reference at flutterwaveinc.mintlify.app). `from`/`to` are whole
    days (YYYY-MM-DD) in a timezone Flutterwave does not document, so the window is widened by
    a day at each end: payments outside [since, until] come back too and are kept (crediting an
    older missing payment is still right; the ledger credits a reference once). The `status`
    filter is not confirmed in official sources: items that are not `successful` are skipped
    here whatever the API did with it. No rate limit is published
    (developer.flutterwave.com/docs/rate-limit): a conservative 0.2 s apart."""

    provider = "flutterwave"

    def _pages(self, calls: Calls, since: datetime, until: datetime) -> Iterator[Page]:
        day = timedelta(days=1)
        params = {
            "from": (since - day).date().isoformat(),
            "to": (until + day).date().isoformat(),
            "status": "successful",
        }
        for number in self._numbers():
            body = calls.json(number, "GET", f"{self.base}/v3/transactions", self._headers, {**params, "page": number})
            items, total_pages = self._check(body, number)
            yield calls.page(number, [_flutterwave_body(i) for i in items if i.get("status") == "successful"])
            if number >= total_pages:
                return

    def _check(self, body: Any, number: int) -> tuple[list[dict[str, Any]], int]:
        if not isinstance(body, dict) or body.get("status") != "success":
            raise self.error(number, 'the answer\'s status is not "success"')
        items, meta = objects(body.get("data")), body.get("meta")
        info = meta.get("page_info") if isinstance(meta, dict) else None
        if items is None or not isinstance(info, dict):
            raise self.error(number, "no data list of transactions, or no meta.page_info")
        current, total_pages = count(info.get("current_page")), count(info.get("total_pages"))
        if current != number or total_pages is None:
            raise self.error(number, "page_info.current_page / total_pages missing or not this page's")
        return items, total_pages


def _flutterwave_body(item: dict[str, Any]) -> bytes:
    """A charge.completed webhook of a list item: its payer e-mail is `customer.email` in one
    official sample, `customer_email` in another (Node-v3 doc vs the Mintlify reference)."""
    customer = item.get("customer")
    customer = dict(customer) if isinstance(customer, dict) else {}
    customer["email"] = customer.get("email") or item.get("customer_email")
    return dumps({"event": "charge.completed", "data": {**item, "customer": customer}})


class Monnify(HttpLister):
    """POST /api/v1/auth/login, then GET /api/v1/transactions/search, Spring pages from 0
    (Monnify/monnify-python base/__init__.py and collection/transaction.py; monnify-dotnet-lib
    Http/MonnifyApiPaths.cs and MonnifyPagedResult.cs; developers.monnify.com/api). The Java SDK
    sends `pageNo`/`pageSize`/`paymentStatusParam` instead: the python and .NET SDKs agree on
    `page`/`size`/`paymentStatus`, used here. No rate limit is published: 0.2 s apart."""

    provider = "monnify"
    size = 100

    def __init__(self, base: str, api_key: str, client_secret: str):
        super().__init__(base, api_key)
        basic = base64.b64encode(f"{api_key}:{client_secret}".encode()).decode()
        self._headers = {"Authorization": f"Basic {basic}"}  # the login's; pages use its token

    def _login(self, calls: Calls, number: int) -> str:
        """A fresh access token (kept for the listing: one login per listing, and one more
        when the token is refused mid-way)."""
        body = calls.json(number, "POST", f"{self.base}/api/v1/auth/login", self._headers)
        ok = isinstance(body, dict) and body.get("requestSuccessful") is True
        answer = body.get("responseBody") if ok else None
        token = answer.get("accessToken") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise self.error(number, "login answered no access token")
        return token

    def _pages(self, calls: Calls, since: datetime, until: datetime) -> Iterator[Page]:
        params = {
            "size": self.size,
            "from": int(since.timestamp() * 1000),  # epoch milliseconds (monnify-python docstring)
            "to": int(until.timestamp() * 1000),
            "paymentStatus": "PAID",
        }
        url = f"{self.base}/api/v1/transactions/search"
        token, logged_in_again = self._login(calls, 1), False
        for number in self._numbers():
            query = {**params, "page": number - 1}
            try:
                body = calls.json(number, "GET", url, {"Authorization": f"Bearer {token}"}, query)
            except ProviderError as exc:
                if exc.status != 401 or logged_in_again:
                    raise
                log.info("monnify page %d: the access token was refused; logging in once more", number)
                token, logged_in_again = self._login(calls, number), True
                body = calls.json(number, "GET", url, {"Authorization": f"Bearer {token}"}, query)
            items, last = self._check(body, number)
            yield calls.page(number, [_monnify_body(i) for i in items if i.get("paymentStatus") == "PAID"])
            if last:
                return

    def _check(self, body: Any, number: int) -> tuple[list[dict[str, Any]], bool]:
        answer = body.get("responseBody") if isinstance(body, dict) else None
        if not isinstance(answer, dict) or body.get("requestSuccessful") is not True:
            raise self.error(number, "requestSuccessful is not true, or no responseBody")
        items, last = objects(answer.get("content")), answer.get("last")
        if items is None or not isinstance(last, bool):
            raise self.error(number, "no content list of transactions, or no `last` flag")
        if "number" in answer and count(answer["number"]) != number - 1:
            raise self.error(number, "responseBody.number is not this page's")
        if not last and not items:
            raise self.error(number, "an empty page that is not the last")
        return items, last


def _monnify_body(item: dict[str, Any]) -> bytes:
    """A SUCCESSFUL_TRANSACTION webhook of a search item, whose fields are named otherwise
    (Java TransactionRecord.java, dotnet TransactionSummary.cs: customerDTO, amount,
    payableAmount, currencyCode); some items also carry the webhook's own names."""
    data = {name: item.get(name) for name in ("transactionReference", "paymentReference", "paymentStatus", "metaData")}
    data["amountPaid"] = item.get("amountPaid", item.get("amount"))
    data["totalPayable"] = item.get("payableAmount")
    data["currency"] = item.get("currencyCode") or item.get("currency")
    data["customer"] = item.get("customerDTO") or item.get("customer")
    return dumps({"eventType": "SUCCESSFUL_TRANSACTION", "eventData": data})


class Stripe(HttpLister):
    """GET /v1/events of payment_intent.succeeded whose delivery has not succeeded ("If false,
    events which are still pending or have failed all delivery attempts to a webhook endpoint
    will be returned"), paged with `starting_after` while `has_more` (stripe-python
    params/_event_list_params.py, _list_object.py). Stripe lists events "going back up to 30
    days": `since` is clamped to that. Rate limit 25 requests/s per endpoint
    (docs.stripe.com/rate-limits): 0.04 s apart."""

    provider = "stripe"
    min_interval_s = 0.04
    limit = 100
    retention = timedelta(days=30)

    def _pages(self, calls: Calls, since: datetime, until: datetime) -> Iterator[Page]:
        since = max(since, datetime.now(timezone.utc) - self.retention)
        params: dict[str, Any] = {
            "type": "payment_intent.succeeded",
            "delivery_success": "false",
            "created[gte]": int(since.timestamp()),
            "created[lte]": int(until.timestamp()),
            "limit": self.limit,
        }
        after: str | None = None
        for number in self._numbers():
            query = params if after is None else {**params, "starting_after": after}
            body = calls.json(number, "GET", f"{self.base}/v1/events", self._headers, query)
            events, has_more = self._check(body, number)
            # an event is the very body Stripe's webhook posts
            yield calls.page(number, [dumps(e) for e in events if e.get("type") == "payment_intent.succeeded"])
            if not has_more:
                return
            after = events[-1]["id"]

    def _check(self, body: Any, number: int) -> tuple[list[dict[str, Any]], bool]:
        if not isinstance(body, dict) or body.get("object") != "list":
            raise self.error(number, 'the answer is not a "list" object')
        events, has_more = objects(body.get("data")), body.get("has_more")
        if events is None or not isinstance(has_more, bool) or len(events) > self.limit:
            raise self.error(number, "no data list of events, or no has_more flag")
        if not all(isinstance(e.get("id"), str) and e["id"] for e in events):
            raise self.error(number, "an event without an id")
        if has_more and not events:
            raise self.error(number, "has_more with no events to page on from")
        return events, has_more


class PaystackDisputes(Paystack):
    """GET /dispute, offset pages like /transaction (PaystackOSS/doc-code-snippets
    src/api/disputes/list: items carry the webhook's `data` of charge.dispute.*: id,
    refund_amount, currency, status, resolution, transaction.reference, customer). A resolved
    one is the body of its charge.dispute.resolve webhook, read by the same parser. Refunds are
    not listed: GET /refund items (src/api/refunds/list) name the transaction by its numeric id
    and the refund by an id its refund.processed webhook does not carry (`refund_reference`), so
    nothing joins a listed refund to its webhook's exactly once."""

    def _pages(self, calls: Calls, since: datetime, until: datetime) -> Iterator[Page]:
        params = {"from": _iso(since), "to": _iso(until), "perPage": self.per_page}
        for number in self._numbers():
            body = calls.json(number, "GET", f"{self.base}/dispute", self._headers, {**params, "page": number})
            items, page_count = self._check(body, number)
            yield calls.page(number, [_dispute_body(i) for i in items if i.get("status") == "resolved"])
            if number >= page_count:
                return


def _dispute_body(item: dict[str, Any]) -> bytes:
    """A charge.dispute.resolve webhook of a listed dispute; its currency, when the item has
    none, is its transaction's."""
    transaction = item.get("transaction")
    currency = item.get("currency") or (transaction.get("currency") if isinstance(transaction, dict) else None)
    return dumps({"event": "charge.dispute.resolve", "data": {**item, "currency": currency}})


class StripeReturns(Stripe):
    """Stripe's undelivered events of money going back, and of Charges API payments: `type`
    takes a wildcard ("A string containing a specific event name, or group of events using * as
    a wildcard", stripe-python params/_event_list_params.py): `charge.*` (charge.succeeded,
    charge.refunded, charge.refund.updated, charge.dispute.*) and `refund.*`, one listing each.
    Each event is the body its webhook posts."""

    groups = ("charge.*", "refund.*")

    def _pages(self, calls: Calls, since: datetime, until: datetime) -> Iterator[Page]:
        since = max(since, datetime.now(timezone.utc) - self.retention)
        numbers = self._numbers()
        for group in self.groups:
            params: dict[str, Any] = {
                "type": group,
                "delivery_success": "false",
                "created[gte]": int(since.timestamp()),
                "created[lte]": int(until.timestamp()),
                "limit": self.limit,
            }
            after: str | None = None
            for number in numbers:
                query = params if after is None else {**params, "starting_after": after}
                body = calls.json(number, "GET", f"{self.base}/v1/events", self._headers, query)
                events, has_more = self._check(body, number)
                prefix = group.rstrip("*")
                yield calls.page(number, [dumps(e) for e in events if str(e.get("type", "")).startswith(prefix)])
                if not has_more:
                    break
                after = events[-1]["id"]


def going_back(lister: Lister) -> Lister | None:
    """The lister of `lister`'s provider's money going back (disputes, refunds) with the same
    base, key and pacing, or None where the provider lists none that joins its webhooks."""
    kinds: dict[type, type[HttpLister]] = {Paystack: PaystackDisputes, Stripe: StripeReturns}
    kind = kinds.get(type(lister))
    if kind is None:
        return None
    twin = kind.__new__(kind)
    twin.__dict__.update(vars(lister))
    return twin


INTERSWITCH = (
    "Interswitch has no list API (only a per-reference re-query, gettransaction.json): its payments are not reconciled"
)
STANDARD = "a Standard Webhooks sender has no API to list its payments: not reconciled"


def listers(cfg: Config) -> dict[str, Lister]:
    """A lister for each provider whose API credentials are set (see `unconfigured`)."""
    found: dict[str, Lister] = {}
    paystack = cfg.secrets.get("paystack", ())
    if paystack:  # the webhook secret is the API's bearer key; the first while rotating
        found["paystack"] = Paystack(cfg.paystack_api_base, paystack[0])
    if cfg.flutterwave_secret_key:
        found["flutterwave"] = Flutterwave(cfg.flutterwave_api_base, cfg.flutterwave_secret_key)
    monnify = cfg.secrets.get("monnify", ())
    if cfg.monnify_api_key and monnify:
        found["monnify"] = Monnify(cfg.monnify_api_base, cfg.monnify_api_key, monnify[0])
    if cfg.stripe_api_key:
        found["stripe"] = Stripe(cfg.stripe_api_base, cfg.stripe_api_key)
    return found


def unconfigured(cfg: Config) -> dict[str, str]:
    """Each provider `listers` leaves out, and why its payments are not reconciled."""
    needs = {
        "paystack": {"PAYSTACK_SECRET_KEY": bool(cfg.secrets.get("paystack"))},
        "flutterwave": {"FLUTTERWAVE_SECRET_KEY": bool(cfg.flutterwave_secret_key)},
        "monnify": {
            "MONNIFY_API_KEY": bool(cfg.monnify_api_key),
            "MONNIFY_CLIENT_SECRET": bool(cfg.secrets.get("monnify")),
        },
        "stripe": {"STRIPE_API_KEY": bool(cfg.stripe_api_key)},
    }
    why = {}
    for provider, variables in needs.items():
        unset = [var for var, is_set in variables.items() if not is_set]
        if unset:
            why[provider] = " and ".join(unset) + " unset"
    return {**why, "interswitch": INTERSWITCH, "standard": STANDARD}
