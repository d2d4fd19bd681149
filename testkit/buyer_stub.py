"""The buyer stub of the benchmarks and the soak: a bare keep-alive HTTP/1.1 server on gevent's
StreamServer rather than a WSGI stack, since it shares the machine's two cores with the system
under test and should cost as little CPU per lead as possible.

    python -m testkit.buyer_stub PORT   # accepts every lead after BUYER_DELAY_MS (default 20)

soak/buyers.py serves its buyers (flaky, slow, hangable) with `read_request` and `reply`. The
tests' buyers, which record every post and switch modes per test, are servers.BuyerServer."""

from __future__ import annotations

import os
import sys

import gevent
from gevent.server import StreamServer

ACCEPT = b'{"accepted": true}'
REASONS = {200: b"OK", 404: b"Not Found", 500: b"Internal Server Error"}


def reply(sock, status: int, body: bytes) -> None:
    sock.sendall(
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % (status, REASONS.get(status, b"OK"), len(body))
        + body
    )


def read_request(sock, buf: bytes):
    """(method, path, headers, body, rest of buf) of the next request, or None at EOF."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    method, path, _ = lines[0].decode("latin-1").split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    length = int(headers.get("content-length", 0))
    while len(buf) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    return method, path, headers, buf[:length], buf[length:]


def accept_after(delay_s: float):
    """A connection handler answering every request with an accept, `delay_s` after it arrived."""

    def handle(sock, _addr) -> None:
        buf = b""
        try:
            while (req := read_request(sock, buf)) is not None:
                buf = req[4]
                gevent.sleep(delay_s)
                reply(sock, 200, ACCEPT)
        except OSError:
            return
        finally:
            sock.close()

    return handle


if __name__ == "__main__":
    delay_s = int(os.environ.get("BUYER_DELAY_MS", "20")) / 1000
    StreamServer(("127.0.0.1", int(sys.argv[1])), accept_after(delay_s), backlog=2048).serve_forever()
