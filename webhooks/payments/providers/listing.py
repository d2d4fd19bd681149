"""The mechanics every provider's listing shares (payment_lists.py has the providers): paced HTTP
calls each under a total deadline and a size cap (the one outbound path, webhooks/outbound.py:
a trickling server cannot hold a job), a page validated whole or refused with ProviderError,
and webhook-shaped bodies written with their amounts exactly as read."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Protocol
from urllib.parse import urlencode

from webhooks import outbound
from webhooks.errors import InvalidJSON
from webhooks.formats import strictjson

log = logging.getLogger(__name__)

DEADLINE_S = 30.0  # of one call, connect to the last byte (a trickling server cannot hold a job)
# of one page's body: a list page must be read whole to be used, so it may pass the 64 KiB of
# every other outbound reply; past this it is refused, not cut (REPORT: Stripe's 100 events)
MAX_BYTES = 16 * 1024 * 1024
MAX_PAGES = 1_000  # a listing longer than this is refused rather than paged on forever
_client = outbound.Client(pool_size=4)


class ProviderError(Exception):
    """A failed, refused (401/403), rate-limited (429), truncated or unreadable page: nothing of
    it may be credited. The message names the provider, the page and the reason, never a
    credential; `status` is the HTTP status when the provider answered one."""

    def __init__(self, provider: str, page: int, reason: str, status: int | None = None):
        super().__init__(f"{provider} page {page}: {reason}")
        self.provider, self.page, self.reason, self.status = provider, page, reason, status


@dataclass(frozen=True)
class Page:
    number: int  # 1-based count of pages read in this listing
    bodies: list[bytes]  # one webhook-shaped JSON body per successful payment on the page
    calls: int  # HTTP calls this page cost (a Monnify login counts)


class Lister(Protocol):
    provider: str

    def pages(self, since: datetime, until: datetime) -> Iterator[Page]: ...


def dumps(value: Any) -> bytes:
    """`value` as JSON, Decimals written as the numbers they were read from (json.dumps cannot
    write a Decimal; a float or a string would change the amount's type or digits)."""
    return _encode(value).encode()


def _encode(value: Any) -> str:  # recursion is bounded: values come from strictjson (MAX_DEPTH)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value)  # finite (strictjson refuses the rest): a valid JSON number
    return json.dumps(value)


def count(value: Any) -> int | None:
    """A non-negative page count or number (an int, or digits in a string), else None."""
    if isinstance(value, str) and value.isdigit() and value.isascii():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def objects(value: Any) -> list[dict[str, Any]] | None:
    """`value` when it is a list of JSON objects, else None."""
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return value
    return None


class Calls:
    """One listing's HTTP calls: paced, each under a time and size budget, answered 200 + JSON."""

    def __init__(self, lister: HttpLister, http: outbound.Client):
        self.lister, self.http = lister, http
        self.count = 0  # calls since the last page was yielded
        self._last = -math.inf

    def json(
        self, page: int, method: str, url: str, headers: dict[str, str], params: dict[str, Any] | None = None
    ) -> Any:
        """The JSON answer (amounts as Decimal) of one call for `page`, or ProviderError."""
        lister = self.lister
        wait = self._last + lister.min_interval_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._last = time.monotonic()
        self.count += 1
        fail = lister.error
        if params:
            url += ("&" if "?" in url else "?") + urlencode(params, doseq=True)
        reply = self.http.request(
            method,
            url,
            headers={"Accept": "application/json", **headers},
            deadline_s=lister.deadline_s,
            max_bytes=lister.max_bytes,
        )
        if reply.failure is not None:
            raise fail(page, f"no complete answer ({reply.failure})")
        if reply.status != 200:
            raise fail(page, _status_reason(reply.status), reply.status)
        if reply.truncated:
            raise fail(page, f"body is over the {lister.max_bytes}-byte cap")
        try:
            return strictjson.loads(reply.body, decimals=True)
        except InvalidJSON as exc:  # MalformedJSON (a cut body) included
            raise fail(page, f"unreadable JSON ({exc.message[:80]})") from None

    def page(self, number: int, bodies: list[bytes]) -> Page:
        page, self.count = Page(number, bodies, self.count), 0
        log.info("%s page %d: %d payments, %d calls", self.lister.provider, number, len(bodies), page.calls)
        return page


def _status_reason(status: int) -> str:
    if status in (401, 403):
        return f"refused ({status}): the API credentials are wrong or lack access"
    if status == 429:
        return "rate limited (429): retried on the next run"
    return f"answered HTTP {status}"


class HttpLister:
    """What every lister shares: the per-call budgets, pacing and page limit (attributes, so a
    test may set `min_interval_s = 0`), and one HTTP session per listing."""

    provider = ""
    min_interval_s = 0.2  # seconds between two calls: under the provider's rate limit
    deadline_s = DEADLINE_S
    max_bytes = MAX_BYTES
    max_pages = MAX_PAGES

    def __init__(self, base: str, api_key: str):
        self.base = base.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"}  # never logged nor put in a message

    def error(self, page: int, reason: str, status: int | None = None) -> ProviderError:
        return ProviderError(self.provider, page, reason, status)

    def pages(self, since: datetime, until: datetime) -> Iterator[Page]:
        """The provider's successful payments from `since` to `until` (aware datetimes), a page
        at a time; ProviderError stops the listing at the first page that is not whole."""
        if since.tzinfo is None or until.tzinfo is None or since > until:
            raise ValueError("since and until must be timezone-aware, since not after until")
        since, until = since.astimezone(timezone.utc), until.astimezone(timezone.utc)
        yield from self._pages(Calls(self, _client), since, until)

    def _pages(self, calls: Calls, since: datetime, until: datetime) -> Iterator[Page]:
        raise NotImplementedError

    def _numbers(self) -> Iterator[int]:
        """1, 2, ... max_pages, then ProviderError: a listing that never ends is refused."""
        yield from range(1, self.max_pages + 1)
        raise self.error(self.max_pages + 1, f"more than {self.max_pages} pages: refused, narrow the window")
