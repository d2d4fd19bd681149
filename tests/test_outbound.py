"""The one outbound path (webhooks/outbound.py) against peers that drip, flood or resolve to a
denied address: each run against a real listening socket of this test, from a plain thread
as an RQ worker calls it and from the test's own thread."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from testkit.servers import read_head, wait_until
from webhooks.outbound import MAX_REPLY_BYTES, Client, DenyList, Failure


@contextmanager
def peer(answer: Callable[[socket.socket], None]) -> Iterator[tuple[str, list[int]]]:
    """A listening socket whose every connection, once its request head is read, is handed to
    `answer`; yields its URL and the list of bytes each answer managed to send."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.1)
    sent: list[int] = []
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            if not read_head(conn):
                return
            try:
                answer(conn)
            except OSError:  # the client hung up
                pass

    def accept() -> None:
        with srv:
            while not done.is_set():
                try:
                    conn, _ = srv.accept()
                except TimeoutError:
                    continue
                conn.settimeout(None)
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}/hook", sent
    finally:
        done.set()


def test_a_reply_dripped_a_byte_at_a_time_ends_at_the_deadline_in_a_worker_thread():
    """requests' timeout is per socket read: a byte every 0.1 s never trips it. The total
    deadline does, in a plain thread as the events worker's pool runs it."""
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        while not stop.wait(0.1):
            conn.sendall(b" ")

    with peer(drip) as (url, _sent), ThreadPoolExecutor(2) as pool:
        try:
            replies = list(
                pool.map(lambda _: Client().request("POST", url, body=b"{}", headers={}, deadline_s=0.5), range(2))
            )
        finally:
            stop.set()
    assert [r.failure for r in replies] == [Failure.TIMEOUT, Failure.TIMEOUT]
    assert all(r.status == 0 and "no full reply within 0.5 s" in (r.error or "") for r in replies)


def test_a_flood_is_read_up_to_the_cap_and_judged_by_its_status():
    sent: list[int] = []

    def flood(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 629145600\r\n\r\n")
        chunk, total = b"x" * 65536, 0
        try:
            for _ in range(9600):  # 600 MB, as fast as the client reads
                conn.sendall(chunk)
                total += len(chunk)
        finally:
            sent.append(total)

    client = Client()
    with peer(flood) as (url, _):
        reply = client.request("POST", url, body=b"{}", headers={}, deadline_s=10)
        assert reply.ok and reply.truncated and len(reply.body) == MAX_REPLY_BYTES
    # the connection was closed, not pooled half-read: the flood stopped at the socket buffers
    wait_until(lambda: sent, what="the flooding peer to notice the hang-up")
    assert sent and sent[0] < 32 * 1024 * 1024


def test_a_reply_within_the_cap_is_read_whole_and_the_connection_reused():
    def answer(conn: socket.socket) -> None:
        while True:
            conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
            if not read_head(conn):
                return

    client = Client()
    with peer(answer) as (url, _):
        first = client.request("POST", url, body=b"{}", headers={}, deadline_s=5)
        second = client.request("POST", url, body=b"{}", headers={}, deadline_s=5)
    assert (first.status, first.body, first.truncated) == (201, b"ok", False) and second.ok


def test_a_host_that_resolves_to_a_denied_address_is_never_connected_to():
    """`localhost` is a name: the check is on the address it resolves to, at connect time."""
    connected: list[bool] = []

    def answer(conn: socket.socket) -> None:
        connected.append(True)

    with peer(answer) as (url, _):
        by_name = url.replace("127.0.0.1", "localhost")
        reply = Client(DenyList(["127.0.0.0/8", "::1/128"])).request("POST", by_name, headers={}, deadline_s=5)
        allowed = Client(DenyList([], allow_loopback=True)).request("POST", by_name, headers={}, deadline_s=5)
    assert reply.failure is Failure.ERROR and "denied address" in (reply.error or "")
    assert allowed.failure is Failure.ERROR  # connected, then hung up on without a reply
    assert connected == [True]  # the allowed client's connection only


def test_a_header_that_cannot_be_sent_is_not_sent():
    reply = Client().request("POST", "http://127.0.0.1:9/", headers={"X-Bad": "a\r\nb"}, deadline_s=1)
    assert reply.failure is Failure.NOT_SENT


def test_a_buyer_or_endpoint_url_in_the_deny_list_is_refused_at_put(api):
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/meta",
        json={"name": "Meta", "endpoint_url": "http://169.254.169.254/x", "priority": 1, "price": "1.00"},
        headers=api.admin,
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_buyer" and "endpoint_url" in resp.json()["error"]["message"]
    ping = {"url": "http://2130706433/ping", "bid": "price"}
    resp = api.http.put(
        f"{api.base}/v1/admin/buyers/meta",
        json={"name": "Meta", "endpoint_url": "http://127.0.0.1:9/x", "priority": 1, "price": "1.00", "ping": ping},
        headers=api.admin,
    )
    assert resp.status_code == 400 and "ping.url" in resp.json()["error"]["message"]
    resp = api.http.put(
        f"{api.base}/v1/admin/event-endpoints/meta", json={"url": "http://[fe80::1]/hook"}, headers=api.admin
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_endpoint"


def test_a_provider_list_page_dripped_ends_the_listing_at_its_deadline_crediting_nothing():
    """Reconciliation's calls go the same way: a page dripped a byte at a time is a failed
    page (nothing of it credited, retried next run), not a job held for as long as it drips."""
    from datetime import datetime, timedelta, timezone

    from webhooks.payments.providers.listing import ProviderError
    from webhooks.payments.providers.payment_lists import Paystack

    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{")
        while not stop.wait(0.05):
            conn.sendall(b" ")

    lister = Paystack("http://127.0.0.1:1", "sk_test_x")
    lister.deadline_s, lister.min_interval_s = 0.5, 0
    now = datetime.now(timezone.utc)
    with peer(drip) as (url, _sent):
        lister.base = url.rsplit("/", 1)[0]
        try:
            with pytest.raises(ProviderError, match="no complete answer"):
                list(lister.pages(now - timedelta(hours=1), now))
        finally:
            stop.set()
