"""Slow and fast clients against the real gunicorn (API.md "Inbound connections are bounded"):
2,200 connections trickling bodies leave /healthz and a publisher's lead answered, and a request
whose headers or body trickle past REQUEST_READ_TIMEOUT_MS is closed unanswered, while a lead
that waits on its buyer, or a keep-alive connection idle between requests, is not; connections
that pipeline requests take turns."""

from __future__ import annotations

import http.client
import os
import select
import signal
import socket
import time

import pytest
import requests

from testkit.payments import child_pids
from testkit.servers import WebServer, wait_until
from testkit.slow_clients import SlowClients, raise_open_files, sockets_held, trickled
from tests.conftest import Api

pytestmark = pytest.mark.e2e  # gunicorn of its own, with its own settings

SLOW = 2_200
CLIENT_TIMEOUT_S = 30  # generous: the contract's one second is a figure for a machine of its own (bench part 22)


def worker_sockets(web: WebServer) -> int:
    """Sockets the web workers hold: accepted connections, their pools, the listener."""
    return sockets_held(child_pids(web.pid))


def answered_lead(api: Api, key: str, lead_id: str) -> dict:
    resp = requests.post(
        f"{api.base}/v1/leads",
        json={"lead_id": lead_id, "state": "TX", "email": f"{lead_id}@example.com"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=CLIENT_TIMEOUT_S,
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_two_thousand_slow_bodies_leave_healthz_and_a_lead_answered(base_env, tmp_path, buyer_server):
    if raise_open_files(SLOW + 512) < SLOW + 512:
        pytest.fail(f"this test needs {SLOW + 512} open files (ulimit -Hn)")
    web = WebServer(base_env, tmp_path / "web.log", workers=2)  # the repo's defaults
    api = Api(web.url)
    try:
        buyer_server.add("acme")
        key = api.put_publisher("calm")
        api.put_buyer("acme", buyer_server.url("acme"))
        api.settle_config()
        assert answered_lead(api, key, "warm")["status"] == "sold"
        baseline = worker_sockets(web)
        # Webhook bodies the view reads, and /healthz bodies nothing reads: one byte every 5 s.
        attack = [trickled("/v1/webhooks/paystack")] * 10 + [trickled("/healthz")]
        with SlowClients(web.port, attack, count=SLOW, interval_s=5, max_s=400) as slow:
            wait_until(
                lambda: worker_sockets(web) - baseline >= SLOW - 50,
                timeout=120,
                what=f"the web workers to hold the {SLOW} slow connections at once",
            )
            rounds = 0
            # Clean requests until the read deadline has closed every slow connection once
            # (they are opened again at once): before, during and after that wave.
            ends = time.monotonic() + 240
            while rounds < 3 or slow.closed_by_server < SLOW:
                assert time.monotonic() < ends, f"the server closed {slow.closed_by_server} slow connections"
                health = requests.get(web.url + "/healthz", timeout=CLIENT_TIMEOUT_S)
                assert (health.status_code, health.json()) == (200, {"status": "ok"})
                lead = answered_lead(api, key, f"calm-{rounds}")
                assert (lead["status"], lead["buyer_id"]) == ("sold", "acme"), lead
                rounds += 1
                time.sleep(0.2)  # clean traffic at ~5 rounds a second
            assert slow.error is None, slow.error
            # the attacker gets its connections back: the last wave of closes is reopened at
            # the attacker's own pace, on a busy machine some time after the loop above ends
            wait_until(
                lambda: slow.open >= SLOW - 50,
                timeout=120,
                what=f"the slow connections the server closed opened again ({slow.open} open as the wait began)",
            )
    finally:
        api.http.close()
        web.stop()


def send_slowly(sock: socket.socket, data: bytes, interval_s: float) -> bytes | None:
    """Send `data` a byte at a time; None if the server closed the connection meanwhile,
    else what the server answered once all of it was sent (b"" for a close)."""
    for i in range(len(data)):
        readable, _, _ = select.select([sock], [], [], interval_s)
        if readable:
            try:
                got = sock.recv(65536)
            except ConnectionError:
                return None
            return None if got == b"" else got
        try:
            sock.sendall(data[i : i + 1])
        except (BrokenPipeError, ConnectionError):
            return None
    return read_answer(sock)


def read_answer(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    try:
        return sock.recv(65536)
    except (ConnectionError, TimeoutError):
        return b""


def test_a_request_trickled_past_the_read_timeout_is_closed_but_a_slow_buyer_or_idle_keepalive_is_not(
    base_env, tmp_path, buyer_server
):
    env = {**base_env, "REQUEST_READ_TIMEOUT_MS": "1000", "BUYER_TIMEOUT_MS": "4000"}
    web = WebServer(env, tmp_path / "web.log", workers=1)
    api = Api(web.url)
    try:
        # Headers, then a body, each taking ~4 s (under gunicorn's 5 s keep-alive) at 0.1 s a byte.
        for head, slowly in (
            (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"X-Pad: " + b"a" * 33 + b"\r\n\r\n"),
            (b"POST /v1/webhooks/paystack HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 40\r\n\r\n", b"b" * 40),
        ):
            with socket.create_connection(("127.0.0.1", web.port)) as sock:
                sock.sendall(head)
                got = send_slowly(sock, slowly, 0.1)
                assert not got, f"answered after {head!r}: {got!r}"

        # A client that waits for `100 Continue` before its body (the worker reads bodies
        # before the app, so it must send that itself): answered, not timed out.
        with socket.create_connection(("127.0.0.1", web.port)) as sock:
            sock.sendall(
                b"POST /v1/webhooks/paystack HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            assert read_answer(sock) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(b"{}")
            assert read_answer(sock).startswith(b"HTTP/1.1 401 ")

        # A lead whose buyer answers after 1.5 s: the app's time is not the client's.
        buyer_server.add("acme", delay=1.5)
        key = api.put_publisher("calm")
        api.put_buyer("acme", buyer_server.url("acme"))
        api.settle_config()
        assert answered_lead(api, key, "slow-buyer")["status"] == "sold"

        # A keep-alive connection idle past the budget between two requests: both answered.
        conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=CLIENT_TIMEOUT_S)
        try:
            conn.request("GET", "/healthz")
            assert conn.getresponse().read() == b'{"status":"ok"}\n'
            first = conn.sock
            time.sleep(1.5)  # the scenario: idle past the 1 s budget, under keepalive's 5 s
            conn.request("GET", "/healthz")
            assert conn.getresponse().read() == b'{"status":"ok"}\n'
            assert conn.sock is first  # one connection: the second request was not a reconnect
        finally:
            conn.close()
    finally:
        api.http.close()
        web.stop()


PIPELINED = 200


def read_answers(sock: socket.socket, count: int) -> bytes:
    """Read until `count` answers have come (each starts with its status line)."""
    got = b""
    while got.count(b"HTTP/1.1 ") < count:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {got.count(b'HTTP/1.1 ')} answers of {count}"
        got += chunk
    return got


def test_connections_that_pipeline_requests_take_turns(base_env, tmp_path):
    """What one client sends must not decide when another is answered. Two keep-alive
    connections to one worker each send 200 requests at once, pipelined; requests that need no
    I/O (404s) never make a socket call block, so gevent alone would serve one connection's 200
    before the other's first. The worker takes turns: its access log alternates."""
    access = tmp_path / "access.log"
    web = WebServer({**base_env, "ACCESS_LOG": str(access)}, tmp_path / "web.log", workers=1)
    conns: list[socket.socket] = []
    try:
        for name in "ab":  # both accepted, and waiting for their next request
            sock = socket.create_connection(("127.0.0.1", web.port), timeout=CLIENT_TIMEOUT_S)
            conns.append(sock)
            sock.sendall(f"GET /turns-{name}-first HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            assert read_answers(sock, 1).startswith(b"HTTP/1.1 404 ")
        [worker] = child_pids(web.pid)
        os.kill(worker, signal.SIGSTOP)  # both pipelines arrive whole before the worker reads either
        try:
            for name, sock in zip("ab", conns):
                pipeline = (f"GET /turns-{name}-{i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" for i in range(PIPELINED))
                sock.sendall("".join(pipeline).encode())
        finally:
            os.kill(worker, signal.SIGCONT)
        for sock in conns:
            assert read_answers(sock, PIPELINED).count(b"HTTP/1.1 404 ") == PIPELINED

        def served() -> list[str] | None:
            names = [line.split("/turns-")[1][0] for line in access.read_text().splitlines() if "/turns-" in line]
            return names[2:] if len(names) == 2 + 2 * PIPELINED else None

        order = wait_until(served, timeout=30, what="the access log's lines")
        runs = [1]
        for before, after in zip(order, order[1:]):
            runs.append(runs[-1] + 1 if after == before else 1)
        assert max(runs) <= 4, f"one connection served {max(runs)} requests in a row: {''.join(order)[:80]}"
    finally:
        for sock in conns:
            sock.close()
        web.stop()
