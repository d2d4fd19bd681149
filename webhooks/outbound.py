"""One outbound HTTP path for every call Floodgate makes (buyer posts and pings, event deliveries,
provider APIs): a hard total deadline around connect, send and the whole reply (a
`gevent.Timeout`: it holds in a web greenlet and an RQ worker's thread alike), at most
MAX_REPLY_BYTES of body and MAX_HEAD_BYTES of head read, certificates verified, no redirect
followed, no POST resent, and no connection to a refused address (this host, link-local,
OUTBOUND_DENY_NETS: webhooks/targets.py), checked on the address connected to, after name
resolution. Why: docs/security.md "Nothing outside can stall
or exhaust Floodgate"."""

from __future__ import annotations

import functools
import logging
import re
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.socket
from geventhttpclient import HTTPClient
from geventhttpclient.connectionpool import ConnectionPool, SSLConnectionPool
from geventhttpclient.response import HTTPParseError, HTTPSocketPoolResponse

from webhooks.logs import redact_text, redact_url
from webhooks.targets import DenyList

log = logging.getLogger(__name__)

MAX_REPLY_BYTES = 64 * 1024  # of a reply's body that is read; the rest never is
MAX_HEAD_BYTES = 64 * 1024  # of its status line and headers
MAX_HOSTS = 1024  # hosts a process keeps connections to (per event loop)
MAX_ERROR = 300  # characters of a failure's description
# What http.client would put on the wire, and nothing else (RFC 9110 token and field-value).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")


class Failure(StrEnum):
    """Why no reply was judged."""

    TIMEOUT = "timeout"  # no full reply within the deadline
    ERROR = "error"  # refused, reset, unresolvable, denied, a broken or oversized head
    NOT_SENT = "not_sent"  # the request could not be built (the caller's fault, not the peer's)


@dataclass(frozen=True, kw_only=True)
class Reply:
    """What one call came to: a status and up to MAX_REPLY_BYTES of body, or a failure."""

    status: int = 0  # 0: no reply
    body: bytes = b""
    truncated: bool = False  # the body was longer than MAX_REPLY_BYTES: only its start is here
    failure: Failure | None = None
    error: str | None = None  # what went wrong, secrets redacted (None: a reply came)
    ms: int = 0

    @property
    def ok(self) -> bool:
        """A 2xx reply."""
        return self.failure is None and 200 <= self.status < 300


class Denied(OSError):
    """The address a host resolved to is refused (webhooks/targets.py): nothing was sent."""


class ReplyTooLong(OSError):
    """More was received than a reply may hold (MAX_HEAD_BYTES of head plus the body read)."""


class _Deadline(Exception):
    """Raised by the gevent.Timeout inside `Client.request`; never escapes it."""


def sendable(headers: Mapping[str, str]) -> bool:
    """Every header is one http.client would put on the wire (checked before the call, so that
    its refusal cannot look like the peer's failure)."""
    return all(_HEADER_NAME.fullmatch(name) and _HEADER_VALUE.fullmatch(value) for name, value in headers.items())


_configured = DenyList()


def configure(nets: Iterable[str], *, allow_loopback: bool = False) -> None:
    """This process's OUTBOUND_DENY_NETS and OUTBOUND_ALLOW_LOOPBACK (create_app and the
    workers' backends call it once)."""
    global _configured
    _configured = DenyList(nets, allow_loopback=allow_loopback)


def deny_list() -> DenyList:
    """This process's refused addresses: what every Client without a DenyList of its own
    checks on each connect, and what a URL saved through the admin API is checked against."""
    return _configured


class _Counted:
    """A pooled connection that refuses to receive more than `left` bytes: geventhttpclient's
    parser keeps whatever headers arrive (unlike http.client, which stops at 100 lines), so a
    peer streaming headers would otherwise fill the process's memory until the deadline."""

    __slots__ = ("sock", "left")

    def __init__(self, sock: gevent.socket.socket) -> None:
        self.sock, self.left = sock, 0

    def recv(self, size: int) -> bytes:
        data: bytes = self.sock.recv(min(size, max(1, self.left)))
        self.left -= len(data)
        if self.left < 0:
            raise ReplyTooLong("the reply's head is longer than a reply may hold")
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _Pool(ConnectionPool):
    """A geventhttpclient pool of one host's connections that refuses denied addresses and
    knows which greenlet holds which connection: a deadline that interrupts a request while
    its body is being sent (a peer that stops reading) leaves the connection checked out, and
    one of the pool's permits with it; enough of those and every call to that host waits out
    its deadline. `abandon` closes that connection and gives the permit back."""

    def __init__(self, *args: Any, deny: DenyList | None, max_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deny, self.max_bytes = deny, max_bytes
        self._held: dict[Any, gevent.socket.socket] = {}

    def _connect_socket(self, sock: gevent.socket.socket, address: Any) -> gevent.socket.socket:
        deny = self.deny or deny_list()  # None: the process's, as configured now
        if isinstance(address, tuple) and deny.denies(str(address[0])):
            raise Denied(
                f"{self._connection_host} resolves to a denied address (this host, link-local or OUTBOUND_DENY_NETS)"
            )
        connected: gevent.socket.socket = super()._connect_socket(sock, address)
        return connected

    def get_socket(self) -> gevent.socket.socket:
        sock = super().get_socket()  # a pooled _Counted, or a new connection
        counted = sock if isinstance(sock, _Counted) else _Counted(sock)
        counted.left = MAX_HEAD_BYTES + self.max_bytes + 1
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


class _HostClient(HTTPClient):
    """geventhttpclient's client for one host, on a pool of `size` keep-alive connections."""

    def __init__(
        self, scheme: str, host: str, port: int, *, timeout_s: float, size: int, deny: DenyList | None, max_bytes: int
    ) -> None:
        super().__init__(host, port=port, concurrency=size, connection_timeout=timeout_s, network_timeout=timeout_s)
        options = {"size": size, "network_timeout": timeout_s, "connection_timeout": timeout_s}
        self.ssl = scheme == "https"
        self._pool: _Pool = (
            _TLSPool(host, port, host, port, ssl_options={}, deny=deny, max_bytes=max_bytes, **options)
            if self.ssl
            else _Pool(host, port, host, port, deny=deny, max_bytes=max_bytes, **options)
        )
        self._connection_pool = self._pool

    def abandon(self) -> None:
        self._pool.abandon()


class Client:
    """Pooled keep-alive connections per host, shared by every greenlet of an event loop.

    geventhttpclient rather than requests' urllib3: a call costs a third of the CPU under
    gevent (bench/REPORT.md, "One lever at a time"), its pool checks an idle connection before
    reusing it as urllib3's does, and its sockets honour a gevent.Timeout in any thread."""

    def __init__(self, deny: DenyList | None = None, pool_size: int = 100) -> None:
        self._deny = deny  # None: the process's (configure), read on every connect
        self.pool_size = pool_size
        self._clients: weakref.WeakKeyDictionary[Any, dict[tuple[str, str, int, float, int], _HostClient]] = (
            weakref.WeakKeyDictionary()
        )

    @functools.lru_cache(maxsize=4096)  # noqa: B019  (a few Clients per process, for its life)
    def _target(self, url: str) -> tuple[str, str, int, str]:
        """(scheme, host, port, path and query) of a URL."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http(s) URL with a host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return parts.scheme, parts.hostname, port, (parts.path or "/") + ("?" + parts.query if parts.query else "")

    def _client(self, scheme: str, host: str, port: int, timeout_s: float, max_bytes: int) -> _HostClient:
        """The client of one host for this thread's event loop: a gevent socket belongs to the
        loop it was made on (a web process has one; each thread of a worker has its own)."""
        clients = self._clients.setdefault(gevent.get_hub(), {})
        key = (scheme, host, port, timeout_s, max_bytes)
        client = clients.get(key)
        if client is None:
            if len(clients) >= MAX_HOSTS:
                # The oldest host's client is dropped, not closed: a greenlet may be about to
                # call through it, and a closed pool refuses that with a RuntimeError. Its idle
                # connections close when it is collected.
                clients.pop(next(iter(clients)))
            client = clients[key] = _HostClient(
                scheme, host, port, timeout_s=timeout_s, size=self.pool_size, deny=self._deny, max_bytes=max_bytes
            )
        return client

    def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: Mapping[str, str],
        deadline_s: float,
        max_bytes: int = MAX_REPLY_BYTES,
    ) -> Reply:
        """Call once under a hard total deadline, reading at most `max_bytes` of the reply's
        body (only a provider's list page, which must be read whole to be used, takes more).
        Never raises for the other side's faults: a failure is in the Reply (TIMEOUT, ERROR,
        or NOT_SENT when the request could not be built)."""
        started = time.perf_counter()

        def failed(failure: Failure, error: str) -> Reply:
            ms = int((time.perf_counter() - started) * 1000)
            return Reply(failure=failure, error=redact_text(f"{error} ({method} {url})")[:MAX_ERROR], ms=ms)

        if not sendable(headers):
            log.warning("request to %s not sent: a header cannot be sent as it is", redact_url(url))
            return failed(Failure.NOT_SENT, "a header cannot be sent as it is")
        client: _HostClient | None = None
        try:
            scheme, host, port, path = self._target(url)
            client = self._client(scheme, host, port, deadline_s, max_bytes)
            with gevent.Timeout(deadline_s, _Deadline):
                resp = client.request(method, path, body=body, headers=dict(headers))
                try:
                    status, content, truncated = resp.status_code, *_read_capped(resp, max_bytes)
                finally:
                    resp.release()  # pooled again only when the whole reply was read
        except (_Deadline, TimeoutError):
            return failed(Failure.TIMEOUT, f"no full reply within {deadline_s:g} s")
        except (HTTPParseError, OSError) as exc:  # refused, reset, unresolvable, denied, a broken reply
            log.info("call to %s failed: %s", redact_url(url), redact_text(str(exc)))
            return failed(Failure.ERROR, f"{type(exc).__name__}: {exc}")
        except (ValueError, TypeError) as exc:  # raised while building the request, before sending
            log.warning("request to %s not sent: %s", redact_url(url), redact_text(str(exc)))
            return failed(Failure.NOT_SENT, f"{type(exc).__name__}: {exc}")
        finally:
            if client is not None:
                client.abandon()
        if truncated:
            log.info("reply of %s is longer than %d bytes: read no further", redact_url(url), max_bytes)
        ms = int((time.perf_counter() - started) * 1000)
        return Reply(status=status, body=content, truncated=truncated, ms=ms)


def _read_capped(resp: HTTPSocketPoolResponse, max_bytes: int) -> tuple[bytes, bool]:
    """The reply's body up to `max_bytes`, and whether there was more. A longer reply's
    connection is then closed on release, not pooled (the message is not complete): the rest
    of it is never read."""
    content = bytes(resp.read(max_bytes + 1))
    if len(content) > max_bytes:
        return content[:max_bytes], True
    return content, False
