"""The buyer post's HTTP client (leads/posting/delivery.py) against buyers that misbehave at the socket:
each run against a real listening socket of this test, no mock between the two."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from webhooks.leads.posting.delivery import MAX_HEAD_BYTES, Deliverer
from webhooks.storage.states import AttemptOutcome

ACCEPTED = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 18\r\n\r\n{"accepted": true}'


def _read_request(conn: socket.socket) -> bytes:
    """One request with a Content-Length body, or b"" when the peer closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head


@contextmanager
def raw_buyer(handle: Callable[[socket.socket, int], None]) -> Iterator[str]:
    """A listening socket whose every connection (numbered from 0) is handed to `handle` in a
    thread of its own; yields its URL."""
    srv = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def serve(conn: socket.socket, n: int) -> None:
        try:
            handle(conn, n)
        except OSError:  # the client hung up (as a deadline or a refused reply makes it)
            pass

    def accept() -> None:
        n = 0
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=serve, args=(conn, n), daemon=True).start()
            n += 1

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}/buy"
    finally:
        srv.close()
        for conn in conns:
            conn.close()


def test_a_buyer_streaming_headers_costs_an_error_not_the_worker_s_memory() -> None:
    def handle(conn: socket.socket, _n: int) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        line = b"X-Padding: " + b"a" * 1000 + b"\r\n"
        try:
            while True:  # headers without end, as fast as the socket takes them
                conn.sendall(line * 64)
        except OSError:
            pass

    with raw_buyer(handle) as url:
        outcome, _ms = Deliverer(5000).deliver(url, b"{}", "key-1")
    # Read without a bound, the headers would arrive until the 5 s deadline (a TIMEOUT, with
    # gigabytes held): the client stops once the reply is past what one may hold.
    assert outcome is AttemptOutcome.ERROR


def test_headers_within_the_bound_are_read() -> None:
    def handle(conn: socket.socket, _n: int) -> None:
        _read_request(conn)
        padding = b"".join(b"X-P%d: %s\r\n" % (i, b"a" * 500) for i in range((MAX_HEAD_BYTES - 1024) // 510))
        conn.sendall(ACCEPTED.replace(b"\r\n\r\n", b"\r\n" + padding + b"\r\n", 1))

    with raw_buyer(handle) as url:
        assert Deliverer(5000).deliver(url, b"{}", "key-1")[0] is AttemptOutcome.ACCEPTED


def test_deadlines_cut_while_sending_do_not_use_up_the_connection_pool() -> None:
    """A buyer that stops reading: the post's body fills the socket's buffers and the deadline
    cuts the send off. Each such post held one of the pool's two connections for good before
    the pool knew which greenlet held which; now the next post to that host still goes out."""
    stalled = threading.Event()
    stalled.set()

    def handle(conn: socket.socket, n: int) -> None:
        if stalled.is_set():
            threading.Event().wait(30)  # never reads; the test's end closes the connection
            return
        while _read_request(conn):
            conn.sendall(ACCEPTED)

    deliverer = Deliverer(300, pool_size=2)
    body = b"x" * (32 * 1024 * 1024)  # past any loopback socket buffer
    with raw_buyer(handle) as url:
        for _ in range(3):
            status, _reply, failure, _ms = deliverer.request("POST", url, body, {"Content-Type": "text/plain"}, 0.3)
            assert failure is AttemptOutcome.TIMEOUT
        stalled.clear()
        assert deliverer.deliver(url, b"{}", "key-2")[0] is AttemptOutcome.ACCEPTED


def test_a_connection_the_buyer_closed_while_idle_is_not_reused() -> None:
    closed = threading.Event()

    def handle(conn: socket.socket, n: int) -> None:
        _read_request(conn)
        conn.sendall(ACCEPTED)  # keep-alive by HTTP/1.1's default...
        if n == 0:
            conn.close()  # ...but closed while idle (a buyer's keep-alive timeout)
            closed.set()
        else:
            while _read_request(conn):
                conn.sendall(ACCEPTED)

    deliverer = Deliverer(2000)
    with raw_buyer(handle) as url:
        assert deliverer.deliver(url, b"{}", "key-1")[0] is AttemptOutcome.ACCEPTED
        assert closed.wait(5)
        # A POST is never sent twice, so a stale connection reused would end as an ERROR.
        assert deliverer.deliver(url, b"{}", "key-2")[0] is AttemptOutcome.ACCEPTED


def test_a_reply_past_the_limit_is_an_error_and_its_connection_is_not_pooled() -> None:
    def handle(conn: socket.socket, n: int) -> None:
        while head := _read_request(conn):
            if b"big" in head:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"a" * 100000)
            else:
                conn.sendall(ACCEPTED)

    deliverer = Deliverer(2000, pool_size=1)
    with raw_buyer(handle) as url:
        assert deliverer.deliver(url + "?big", b"{}", "key-1")[0] is AttemptOutcome.ERROR
        # The unread rest of the big reply would be read as this post's reply on a reused
        # connection; on a new one it is the buyer's own answer.
        assert deliverer.deliver(url, b"{}", "key-2")[0] is AttemptOutcome.ACCEPTED


def test_a_buyer_s_certificate_is_verified(tmp_path) -> None:
    """An https buyer whose certificate no authority signed is never posted to: the post is an
    ERROR, the handshake refused before a byte of the lead is sent."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    received: list[bytes] = []

    def handle(conn: socket.socket, _n: int) -> None:
        with context.wrap_socket(conn, server_side=True) as tls:
            received.append(_read_request(tls))
            tls.sendall(ACCEPTED)

    with raw_buyer(handle) as url:
        outcome, _ms = Deliverer(2000).deliver(url.replace("http://", "https://"), b"{}", "key-1")
    assert outcome is AttemptOutcome.ERROR
    assert received == []
