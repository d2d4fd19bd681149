"""A buyer endpoint for benchmarks: accepts every lead after BUYER_DELAY_MS (default 20 ms).

A bare keep-alive HTTP/1.1 responder on gevent's StreamServer rather than a WSGI stack: the
buyer shares the machine's two cores with the system under test, so it should cost as little
CPU as possible per lead."""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import os
import sys

import gevent
from gevent.server import StreamServer

DELAY_S = int(os.environ.get("BUYER_DELAY_MS", "20")) / 1000
BODY = b'{"accepted": true}'
REPLY = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)) + BODY


def handle(sock, _addr) -> None:
    buf = b""
    try:
        while True:
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                buf += chunk
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buf) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                buf += chunk
            buf = buf[length:]
            gevent.sleep(DELAY_S)
            sock.sendall(REPLY)
    except OSError:
        return
    finally:
        sock.close()


if __name__ == "__main__":
    StreamServer(("127.0.0.1", int(sys.argv[1])), handle, backlog=2048).serve_forever()
