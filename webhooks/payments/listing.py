"""The mechanics every provider's listing shares (providers.py has the providers): paced HTTP
calls each under a time and size budget (requests' timeout is per socket operation, so the
body is read against a deadline of its own), a page validated whole or refused with
ProviderError, and webhook-shaped bodies written with their amounts exactly as read."""

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

import requests
import urllib3.exceptions

from webhooks import strictjson
from webhooks.errors import InvalidJSON

log = logging.getLogger(__name__)

TIMEOUT_S = (5.0, 20.0)  # requests' (connect, read): per socket operation
DEADLINE_S = 30.0  # the whole body must be read by then (a trickling server cannot hold a job)
MAX_BYTES = 16 * 1024 * 1024  # of one page's body, decoded
MAX_PAGES = 1_000  # a listing longer than this is refused rather than paged on forever
CHUNK = 64 * 1024


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


def objects(value: Any) -> list[dict] | None:
    """`value` when it is a list of JSON objects, else None."""
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return value
    return None


class Calls:
    """One listing's HTTP calls: paced, each under a time and size budget, answered 200 + JSON."""

    def __init__(self, lister: HttpLister, http: requests.Session):
        self.lister, self.http = lister, http
        self.count = 0  # calls since the last page was yielded
        self._last = -math.inf

    def json(self, page: int, method: str, url: str, headers: dict[str, str], params: dict | None = None) -> Any:
        """The JSON answer (amounts as Decimal) of one call for `page`, or ProviderError."""
        lister = self.lister
        wait = self._last + lister.min_interval_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._last = time.monotonic()
        self.count += 1
        fail = lister.error
        try:
            with self.http.request(
                method,
                url,
                params=params,
                headers={"Accept": "application/json", **headers},
                timeout=lister.timeout,
                stream=True,
                allow_redirects=False,
            ) as resp:
                status = resp.status_code
                if status != 200:
                    raise fail(page, _status_reason(status), status)
                raw = self._read(resp, page)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise fail(page, f"no complete answer ({type(exc).__name__})") from None
        try:
            return strictjson.loads(raw, decimals=True)
        except InvalidJSON as exc:  # MalformedJSON (a cut body) included
            raise fail(page, f"unreadable JSON ({exc.message[:80]})") from None

    def _read(self, resp: requests.Response, page: int) -> bytes:
        """The whole body, read in chunks until the deadline or the size cap (then refused)."""
        lister = self.lister
        declared = resp.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > lister.max_bytes:
            raise lister.error(page, f"body of {declared} bytes is over the {lister.max_bytes}-byte cap")
        deadline = time.monotonic() + lister.deadline_s
        chunks: list[bytes] = []
        size = 0
        # read1 returns what one socket read gives: the deadline is checked at least once per
        # read timeout, so the whole read lasts at most deadline_s + the read timeout. Decoded
        # (requests asks for gzip): the cap counts what a gzip body inflates to.
        while chunk := resp.raw.read1(CHUNK, decode_content=True):
            size += len(chunk)
            if size > lister.max_bytes:
                raise lister.error(page, f"body is over the {lister.max_bytes}-byte cap")
            if time.monotonic() > deadline:
                raise lister.error(page, f"body not read within {lister.deadline_s:g} s")
            chunks.append(chunk)
        return b"".join(chunks)

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
    timeout = TIMEOUT_S
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
        with requests.Session() as http:
            yield from self._pages(Calls(self, http), since, until)

    def _pages(self, calls: Calls, since: datetime, until: datetime) -> Iterator[Page]:
        raise NotImplementedError

    def _numbers(self) -> Iterator[int]:
        """1, 2, ... max_pages, then ProviderError: a listing that never ends is refused."""
        yield from range(1, self.max_pages + 1)
        raise self.error(self.max_pages + 1, f"more than {self.max_pages} pages: refused, narrow the window")
