"""Delivery of a lead to a buyer under a hard total deadline, and the outcome of API.md.

`requests`' own timeout is per socket operation, so a buyer trickling a byte a second would
hold the lead forever; the gevent.Timeout around the whole call is the real deadline (the web
process is always gevent-patched, see gunicorn.conf.py). The socket timeout stays as a
backstop for code run without gevent.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from urllib.parse import urlsplit

import gevent
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from webhooks.leads.integration import DEFAULT_DELIVERY, Delivery
from webhooks.logs import redact_text, redact_url
from webhooks.storage.states import AttemptOutcome

log = logging.getLogger(__name__)

USER_AGENT = "Floodgate/1"
ACCEPTED, REJECTED, ERROR, TIMEOUT = (
    AttemptOutcome.ACCEPTED,
    AttemptOutcome.REJECTED,
    AttemptOutcome.ERROR,
    AttemptOutcome.TIMEOUT,
)
CIRCUIT_OPEN = AttemptOutcome.CIRCUIT_OPEN
# An attempt whose answer was lost with a dead process and that the buyer did not confirm
# when offered the lead again (API.md): the lead is unsold and flagged for review.
UNKNOWN = AttemptOutcome.UNKNOWN
# Floodgate could not build or send the request (a header http.client refuses, a template over
# its budget): the lead's problem, never the buyer's. Not an attempt: the buyer is skipped
# with this reason and its breaker is left alone.
NOT_SENT = AttemptOutcome.NOT_SENT
TEST_HEADER = "X-Floodgate-Test"  # on the pings of a test lead (it is never posted)
MAX_REPLY_BYTES = 64 * 1024  # of a buyer's or a ping's reply; a longer one is an unreadable reply
# What http.client sends without complaint, and nothing else (RFC 9110 token and field-value).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")


def sendable(headers: dict[str, str]) -> bool:
    """Every header is one http.client will put on the wire (checked before the call, so that
    its refusal cannot look like the buyer's failure)."""
    return all(_HEADER_NAME.fullmatch(name) and _HEADER_VALUE.fullmatch(value) for name, value in headers.items())


class _Deadline(Exception):
    """Raised by gevent.Timeout inside the delivery; never escapes `deliver`."""


def classify(status: int, content: bytes) -> AttemptOutcome:
    if 200 <= status < 300:
        try:
            body = json.loads(content)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return ERROR  # a non-JSON 2xx (or one nested past Python's stack) is an unreadable reply
        return ACCEPTED if isinstance(body, dict) and body.get("accepted") is True else REJECTED
    if 400 <= status < 500:
        return REJECTED
    return ERROR


class Deliverer:
    """Pooled keep-alive connections per buyer host, shared by every greenlet of a process."""

    def __init__(self, timeout_ms: int, pool_size: int = 100):
        self.timeout_s = timeout_ms / 1000
        self._timeout = urllib3.Timeout(connect=self.timeout_s, read=self.timeout_s)
        # requests' transport adapter owns the connection pools. A buyer post goes straight
        # to the adapter's pool: requests' Session and Response layers (cookies, proxies,
        # hooks, header dicts) cost more CPU per lead than the rest of routing (bench/).
        self.adapter = HTTPAdapter(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)

    @functools.lru_cache(maxsize=4096)  # noqa: B019  (one Deliverer per process, for its life)
    def _target(self, url: str) -> tuple[urllib3.HTTPConnectionPool, str]:
        parts = urlsplit(url)
        return self.adapter.poolmanager.connection_from_url(url), (parts.path or "/") + (
            "?" + parts.query if parts.query else ""
        )

    def request(
        self, method: str, url: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes, AttemptOutcome | None, int]:
        """Send one request under a hard total deadline: (status, reply, failure, elapsed ms),
        failure being ERROR or TIMEOUT when no full reply came (status 0 then), or NOT_SENT
        when the request could not be built. A reply longer than MAX_REPLY_BYTES is not
        read past that: an ERROR. Never raises for the other side's faults."""
        started = time.perf_counter()
        failure: AttemptOutcome | None = None
        status, content = 0, b""
        if not sendable(headers):
            log.warning("request to %s not sent: a header cannot be sent as it is", redact_url(url))
            return status, content, NOT_SENT, 0
        try:
            pool, path = self._target(url)
            with gevent.Timeout(timeout_s, _Deadline):
                # the whole reply must arrive inside the deadline, and no more of it than the limit
                resp = pool.urlopen(
                    method,
                    path,
                    body=body,
                    headers=headers,
                    retries=False,
                    redirect=False,
                    assert_same_host=False,
                    preload_content=False,
                    timeout=self._timeout
                    if timeout_s == self.timeout_s
                    else urllib3.Timeout(connect=timeout_s, read=timeout_s),
                )
                status, reply = resp.status, _read_capped(resp)
            if reply is None:
                log.info("reply of %s is longer than %d bytes: not read", redact_url(url), MAX_REPLY_BYTES)
                status, failure = 0, ERROR
            else:
                content = reply
        except NewConnectionError as exc:  # a ConnectTimeoutError subclass, but a refusal
            log.info("delivery to %s failed: %s", redact_url(url), redact_text(str(exc)))
            failure = ERROR
        except (_Deadline, Urllib3Timeout):
            failure = TIMEOUT
        except (Urllib3Error, OSError) as exc:
            log.info("delivery to %s failed: %s", redact_url(url), redact_text(str(exc)))
            failure = ERROR
        except (ValueError, TypeError) as exc:  # raised while building the request, before sending
            log.warning("request to %s not sent: %s", redact_url(url), redact_text(str(exc)))
            failure = NOT_SENT
        return status, content, failure, int((time.perf_counter() - started) * 1000)

    def deliver(
        self, url: str, body: bytes, idempotency_key: str, delivery: Delivery = DEFAULT_DELIVERY
    ) -> tuple[AttemptOutcome, int]:
        """Post `body` to `url` as `delivery` says; return (outcome, elapsed ms)."""
        headers = {
            "Content-Type": delivery.content_type,
            "Content-Length": str(len(body)),
            "Idempotency-Key": idempotency_key,
            "User-Agent": USER_AGENT,
            **dict(delivery.headers),
        }
        status, content, failure, ms = self.request(delivery.method, url, body, headers, self.timeout_s)
        if failure is not None:
            return failure, ms
        if delivery is DEFAULT_DELIVERY:
            return classify(status, content), ms
        return judge(status, content, delivery), ms

    def ping(
        self, url: str, body: bytes, timeout_s: float, test: bool = False
    ) -> tuple[int, bytes, AttemptOutcome | None, int]:
        """POST a ping's JSON `body`; (status, reply, failure, ms) as `request`. The ping of a
        test lead carries `X-Floodgate-Test: 1`: the buyer may bid, and will not be posted to."""
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), "User-Agent": USER_AGENT}
        if test:
            headers[TEST_HEADER] = "1"
        return self.request("POST", url, body, headers, timeout_s)


def _read_capped(resp: urllib3.BaseHTTPResponse) -> bytes | None:
    """The reply's body, or None when it is longer than MAX_REPLY_BYTES (its connection is then
    closed, not pooled: the rest of the reply is never read)."""
    declared = resp.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > MAX_REPLY_BYTES:
        content = None
    else:
        content = resp.read(MAX_REPLY_BYTES + 1)
        if len(content) <= MAX_REPLY_BYTES:  # short of the amount asked: the whole reply
            resp.release_conn()
            return content
    resp.close()
    resp.release_conn()
    return None


def judge(status: int, content: bytes, delivery: Delivery) -> AttemptOutcome:
    """The outcome of a reply under a buyer's own accept rule."""
    if 200 <= status < 300:
        verdict = delivery.accepted(content)
        return ERROR if verdict is None else ACCEPTED if verdict else REJECTED
    return REJECTED if 400 <= status < 500 else ERROR
