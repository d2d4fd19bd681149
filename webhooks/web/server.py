"""The `web` process's gunicorn worker: gevent's, with a total read deadline per request
(REQUEST_READ_TIMEOUT_MS, docs/api.md "Inbound connections are bounded"), a turn for every
connection between one connection's requests, and the open-files limit its connections need.
docs/operations.md says what each costs and what to put in front."""

from __future__ import annotations

import io
import re
import resource
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

import gevent
from gunicorn.glogging import Logger
from gunicorn.http.body import Body
from gunicorn.http.errors import ParseException
from gunicorn.workers.ggevent import GeventWorker

from webhooks.web.http import body_limit

# The most of an unread request body (a 405 or 413 answered before the view read it) that is
# read and thrown away to keep the connection; past it the connection is closed (gunicorn's own
# figure, http/parser.py _DRAIN_MAX_BYTES).
DRAIN_MAX_BYTES = 64 * 1024

# gevent switches greenlets only where a socket call would block. A keep-alive client that sends
# its next request at once (or many pipelined), served by backends that answer at once (Redis on
# the same host), never blocks: its greenlet would serve request after request while the
# worker's other connections wait unread (bench/REPORT.md part 39: wrk's p99 0.9-1.3 s against
# 69-77 ms at 50 connections). A positive sleep, however short, resumes only after the event
# loop's next poll (gevent.sleep's documentation; sleep(0) may resume before it), so after each
# request every connection whose bytes have arrived takes its turn before this one's next one.
TURN_S = 1e-6

T = TypeVar("T")


class ReadTimedOut(BaseException):
    """The client took longer than its read budget. A BaseException, as gevent.Timeout is, so
    that no `except Exception` on its way (gunicorn's, an app's) answers a request that is
    still arriving: it unwinds to the worker, which closes the connection."""


class DeadlineSocket:
    """A client connection whose reads share one budget per request. gunicorn's own timeouts
    are per read (a byte every few seconds passes them all); here the time a request's reads
    wait on the client is summed, and when it passes `budget_s` the read raises ReadTimedOut.
    Only waiting counts, never work between reads. The first request's budget runs from
    accept; between requests (`request_done`) the wait for the next one's first byte is
    gunicorn's keepalive, and the budget starts again with that byte. Everything else is the
    socket's own."""

    def __init__(self, sock: socket.socket, budget_s: float) -> None:
        self._sock = sock
        self.budget_s = budget_s
        self.left: float | None = budget_s  # None: between requests

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def recv(self, size: int, *flags: int) -> bytes:
        return self._timed(lambda: self._sock.recv(size, *flags))

    def recv_into(self, buffer: Any, *args: int) -> int:
        return self._timed(lambda: self._sock.recv_into(buffer, *args))

    def request_done(self) -> None:
        self.left = None

    def _timed(self, read: Callable[[], T]) -> T:
        if self.left is None:  # idle between requests: gunicorn's keepalive bounds this wait
            got = read()
            self.left = self.budget_s
            return got
        if self.left <= 0:
            raise ReadTimedOut
        started = time.monotonic()
        try:
            with gevent.Timeout(self.left, ReadTimedOut):
                return read()
        finally:
            self.left -= time.monotonic() - started


class DeadlineWorker(GeventWorker):  # type: ignore[misc]  # gunicorn ships no types
    """gunicorn's gevent worker, reading each request whole within `read_timeout_s` before
    the app sees it (with_limits)."""

    read_timeout_s = 10.0
    max_body_bytes = 256 * 1024

    @classmethod
    def with_limits(cls, *, read_timeout_ms: int, max_body_bytes: int) -> type[DeadlineWorker]:
        """The worker class gunicorn.conf.py names: REQUEST_READ_TIMEOUT_MS and the body cap."""
        limits = {"read_timeout_s": read_timeout_ms / 1000, "max_body_bytes": max_body_bytes}
        return type(cls.__name__, (cls,), limits)

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        super().handle(listener, DeadlineSocket(client, self.read_timeout_s), addr)

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> bool:
        """Read the body (up to the cap) before the app runs, as a buffering proxy would: a
        client that trickles it costs a greenlet and a descriptor, never a request in Flask,
        and the app's own time never counts against the client. Then serve the request, read
        what is left of the body within the same budget, and let the worker's other connections
        take their turn (TURN_S) before this one's next request."""
        body = req.body
        limit = body_limit(req.path or "", self.max_body_bytes)
        declared = next((v for name, v in req.headers if name == "CONTENT-LENGTH"), None)
        if declared is None or int(declared) <= limit:  # a longer one is 413 unread
            if req._expected_100_continue:  # the client waits for it before sending the body
                sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
                req._expected_100_continue = False  # gunicorn would send it again
            req.body = Body(io.BytesIO(_read_upto(body, limit + 1)))
        kept = super().handle_request(listener_name, req, sock, addr)
        if not _drained(body):
            raise StopIteration  # gunicorn's way to close the connection after an answer
        sock.request_done()
        gevent.sleep(TURN_S)  # every other connection with bytes waiting is served first
        return bool(kept)

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        if isinstance(exc, ReadTimedOut):  # too slow: closed without an answer (docs/api.md)
            self.log.debug("closed a connection whose request took over %ss to arrive", self.read_timeout_s)
            return
        super().handle_error(req, client, addr, exc)


def _read_upto(body: Any, limit: int) -> bytes:
    """At most `limit` bytes of `body`, read 64 KiB at a time into one buffer (one copy of
    the body held while the client sends it, not a list of pieces and their join)."""
    buf = bytearray()
    while len(buf) < limit:
        piece = body.read(min(64 * 1024, limit - len(buf)))
        if not piece:
            break
        buf += piece
    return bytes(buf)


def _drained(body: Any) -> bool:
    """Read the rest of a request's `body`, at most DRAIN_MAX_BYTES: False when the connection
    must close (more than that, or a body that cannot be read to its end)."""
    if body is None:
        return True
    if body.failed:
        return False
    left = DRAIN_MAX_BYTES
    try:
        while left > 0:
            data = body.read(min(8192, left))
            if not data:
                return True
            left -= len(data)
    except (ParseException, OSError):  # malformed chunks, or a client gone mid-body
        return False
    return not body.read(1)


def raise_open_files_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (the workers fork with it):
    each connection is a descriptor, and a soft limit of 1024 would cap the connections
    below worker_connections. Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # an unlimited hard limit Linux refuses: keep the soft one
            pass
    return soft


# An operator user's set-up link is its own key until used (webhooks/web/people/setup.py): the
# access log writes its path without the token, as it writes no query string (`?token=`).
SETUP_PATH = re.compile(r"^/ops/setup/[^/]+")


class AccessLog(Logger):  # type: ignore[misc]  # gunicorn ships no types: Logger is Any
    """gunicorn's logger, the set-up link's token left out of the access log's path."""

    def atoms(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> dict[str, Any]:
        atoms: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        path = atoms.get("U")
        if isinstance(path, str):
            atoms["U"] = SETUP_PATH.sub("/ops/setup/-", path)
        return atoms
