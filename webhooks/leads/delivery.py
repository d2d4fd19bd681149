"""Delivery of a lead to a buyer under a hard total deadline, and the outcome of API.md.

A socket timeout is per socket operation, so a buyer trickling a byte a second would hold the
lead forever; the gevent.Timeout around the whole call is the real deadline (geventhttpclient's
sockets are gevent's, patched or not). The socket timeout stays as a backstop.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
import weakref
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.socket
from geventhttpclient import HTTPClient
from geventhttpclient.connectionpool import ConnectionPool, SSLConnectionPool
from geventhttpclient.response import HTTPParseError, HTTPSocketPoolResponse

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
MAX_HOSTS = 1024  # buyer hosts a process keeps connections to
MAX_REPLY_BYTES = 64 * 1024  # of a buyer's or a ping's reply; a longer one is an unreadable reply
MAX_HEAD_BYTES = 64 * 1024  # of its status line and headers
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


class ReplyTooLong(OSError):
    """A buyer sent more than a reply may hold (MAX_HEAD_BYTES of status line and headers and
    MAX_REPLY_BYTES of body): the connection is closed, the attempt is an ERROR."""


class _Counted:
    """A pooled connection that refuses to receive more than `left` bytes: geventhttpclient's
    parser keeps whatever headers arrive (unlike http.client, which stops at 100 lines), so a
    buyer streaming headers would otherwise fill the web worker's memory until the deadline."""

    __slots__ = ("sock", "left")

    def __init__(self, sock: gevent.socket.socket) -> None:
        self.sock, self.left = sock, 0

    def recv(self, size: int) -> bytes:
        data: bytes = self.sock.recv(min(size, max(1, self.left)))
        self.left -= len(data)
        if self.left < 0:
            raise ReplyTooLong(f"the reply is longer than {MAX_HEAD_BYTES + MAX_REPLY_BYTES} bytes")
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _Pool(ConnectionPool):
    """A geventhttpclient pool of one host's connections that knows which greenlet holds which
    connection: a deadline that interrupts a request while its body is being sent (a buyer
    that stops reading) leaves the connection checked out, and one of the pool's permits with
    it; enough of those and every post to that host waits out its deadline. `abandon` closes
    that connection and gives the permit back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[Any, gevent.socket.socket] = {}

    def get_socket(self) -> gevent.socket.socket:
        sock = super().get_socket()  # a pooled _Counted, or a new connection
        counted = sock if isinstance(sock, _Counted) else _Counted(sock)
        counted.left = MAX_HEAD_BYTES + MAX_REPLY_BYTES + 1
        self._held[gevent.getcurrent()] = counted  # type: ignore[assignment]
        return counted  # type: ignore[return-value]

    def return_socket(self, sock: gevent.socket.socket) -> None:
        self._forget(sock)
        super().return_socket(sock)

    def release_socket(self, sock: gevent.socket.socket) -> None:
        self._forget(sock)
        super().release_socket(sock)

    def _forget(self, sock: gevent.socket.socket) -> None:
        me = gevent.getcurrent()
        if self._held.get(me) is sock:
            del self._held[me]
        else:  # returned by another greenlet (a response read elsewhere): find it
            for holder, held in list(self._held.items()):
                if held is sock:
                    del self._held[holder]

    def abandon(self) -> None:
        """Close the connection this greenlet still holds, if any (its request was cut off)."""
        sock = self._held.get(gevent.getcurrent())
        if sock is not None:
            self.release_socket(sock)


class _TLSPool(_Pool, SSLConnectionPool):  # verifies the certificate and the host name
    pass


class _Client(HTTPClient):
    """geventhttpclient's client for one host, on a pool of `size` keep-alive connections."""

    def __init__(self, scheme: str, host: str, port: int, timeout_s: float, size: int) -> None:
        super().__init__(host, port=port, concurrency=size, connection_timeout=timeout_s, network_timeout=timeout_s)
        options = {"size": size, "network_timeout": timeout_s, "connection_timeout": timeout_s}
        self.ssl = scheme == "https"
        self._pool: _Pool = (
            _TLSPool(host, port, host, port, ssl_options={}, **options)
            if self.ssl
            else _Pool(host, port, host, port, **options)
        )
        self._connection_pool = self._pool

    def abandon(self) -> None:
        self._pool.abandon()


class Deliverer:
    """Pooled keep-alive connections per buyer host, shared by every greenlet of a process.

    The client is geventhttpclient's (the one locust's fast client uses), not requests'
    urllib3: a buyer post costs a third of the CPU (bench/REPORT.md, "One lever at a time"),
    and its connection pool checks an idle connection before reusing it as urllib3's does.
    It follows no redirect and does not retry a POST whose request may have been sent."""

    def __init__(self, timeout_ms: int, pool_size: int = 100):
        self.timeout_s = timeout_ms / 1000
        self.pool_size = pool_size
        self._clients: weakref.WeakKeyDictionary[Any, dict[tuple[str, str, int, float], _Client]] = (
            weakref.WeakKeyDictionary()
        )

    @functools.lru_cache(maxsize=4096)  # noqa: B019  (one Deliverer per process, for its life)
    def _target(self, url: str) -> tuple[str, str, int, str]:
        """(scheme, host, port, path and query) of a buyer's URL."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http(s) URL with a host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return parts.scheme, parts.hostname, port, (parts.path or "/") + ("?" + parts.query if parts.query else "")

    def _client(self, scheme: str, host: str, port: int, timeout_s: float) -> _Client:
        """The client of one host for this thread's event loop: a gevent socket belongs to the
        loop it was made on (a web process has one; a test's threads have one each)."""
        clients = self._clients.setdefault(gevent.get_hub(), {})
        key = (scheme, host, port, timeout_s)
        client = clients.get(key)
        if client is None:
            if len(clients) >= MAX_HOSTS:
                # The oldest host's client is dropped, not closed: a greenlet may be about to
                # post through it, and a closed pool refuses that with a RuntimeError. Its idle
                # connections close when it is collected.
                clients.pop(next(iter(clients)))
            client = clients[key] = _Client(scheme, host, port, timeout_s, self.pool_size)
        return client

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
        client: _Client | None = None
        try:
            scheme, host, port, path = self._target(url)
            client = self._client(scheme, host, port, timeout_s)
            with gevent.Timeout(timeout_s, _Deadline):
                # the whole reply must arrive inside the deadline, and no more of it than the limit
                resp = client.request(method, path, body=body, headers=headers)
                try:
                    status, reply = resp.status_code, _read_capped(resp)
                finally:
                    resp.release()  # pooled again only when the whole reply was read
            if reply is None:
                log.info("reply of %s is longer than %d bytes: not read", redact_url(url), MAX_REPLY_BYTES)
                status, failure = 0, ERROR
            else:
                content = reply
        except (_Deadline, TimeoutError):
            failure = TIMEOUT
        except (HTTPParseError, OSError) as exc:  # refused, reset, unresolvable, a broken reply
            log.info("delivery to %s failed: %s", redact_url(url), redact_text(str(exc)))
            failure = ERROR
        except (ValueError, TypeError) as exc:  # raised while building the request, before sending
            log.warning("request to %s not sent: %s", redact_url(url), redact_text(str(exc)))
            failure = NOT_SENT
        finally:
            if client is not None:
                client.abandon()
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


def _read_capped(resp: HTTPSocketPoolResponse) -> bytes | None:
    """The reply's body, or None when it is longer than MAX_REPLY_BYTES (its connection is then
    closed, not pooled: the rest of the reply is never read)."""
    declared = resp.get("content-length")
    if isinstance(declared, str) and declared.isdigit() and int(declared) > MAX_REPLY_BYTES:
        return None
    content = resp.read(MAX_REPLY_BYTES + 1)
    return bytes(content) if len(content) <= MAX_REPLY_BYTES else None


def judge(status: int, content: bytes, delivery: Delivery) -> AttemptOutcome:
    """The outcome of a reply under a buyer's own accept rule."""
    if 200 <= status < 300:
        verdict = delivery.accepted(content)
        return ERROR if verdict is None else ACCEPTED if verdict else REJECTED
    return REJECTED if 400 <= status < 500 else ERROR
