"""Event receivers that drip or flood, beside a healthy one and live lead traffic, on the whole
stack (gunicorn, the Procfile's settlement and events workers, a private Redis, the database):
each costs its own endpoint failed or cut attempts, never a settlement, another endpoint's
events or the worker's memory (API.md "Nothing outside can stall or exhaust Floodgate")."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from testkit.events import EventReceiver
from testkit.servers import read_head, wait_until
from tests.conftest import Api
from tests.e2e.test_event_endpoints import SECRETS, lead_ids, put_endpoint
from tests.e2e.test_payment_lifecycle import running_stack

pytestmark = pytest.mark.e2e  # gunicorn and two RQ workers of its own

LEADS = 120
FLOOD_BYTES = 600 * 1024 * 1024  # what the flooding receiver says its reply holds


class RawReceiver:
    """A receiver at the socket: reads each request's head and hands the connection to
    `answer`, counting the bytes it manages to send until Floodgate hangs up."""

    def __init__(self, answer: Callable[[socket.socket, RawReceiver], None]):
        self.answer = answer
        self.sent = 0
        self.requests = 0
        self.lock = threading.Lock()
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.closing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.srv.getsockname()[1]}/hook"

    def count(self, n: int) -> None:
        with self.lock:
            self.sent += n

    def _accept(self) -> None:
        self.srv.settimeout(0.1)  # looks at `closing` between accepts
        with self.srv:
            while not self.closing.is_set():
                try:
                    conn, _ = self.srv.accept()
                except TimeoutError:
                    continue
                conn.settimeout(None)
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if not read_head(conn):
                return
            with self.lock:
                self.requests += 1
            try:
                self.answer(conn, self)
            except OSError:  # Floodgate hung up: what this test wants to see
                pass

    def close(self) -> None:
        self.closing.set()  # the accepting thread closes the listening socket


def drip(conn: socket.socket, rx: RawReceiver) -> None:
    """`200 OK`, then one byte of a 1,000-byte body every 0.3 s: no socket read ever times out."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    while not rx.closing.wait(0.3):
        conn.sendall(b" ")
        rx.count(1)


def flood(conn: socket.socket, rx: RawReceiver) -> None:
    """`200 OK` and 600 MB of body, as fast as Floodgate reads it."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % FLOOD_BYTES)
    chunk = b"x" * 65536
    for _ in range(FLOOD_BYTES // len(chunk)):
        conn.sendall(chunk)
        rx.count(len(chunk))
        if rx.closing.is_set():
            return


@contextmanager
def raw_receivers() -> Iterator[tuple[RawReceiver, RawReceiver]]:
    dripping, flooding = RawReceiver(drip), RawReceiver(flood)
    try:
        yield dripping, flooding
    finally:
        dripping.close()
        flooding.close()


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_dripping_and_a_flooding_receiver_delay_no_settlement_and_no_other_endpoint(
    base_env, database_url, tmp_path, buyer_server
):
    env = {"EVENT_DELIVERY_TIMEOUT_MS": "2000", "PAYMENT_EVENTS_RETRY_BASE_MS": "200"}
    healthy = EventReceiver(SECRETS[0])
    with running_stack(base_env, tmp_path, env) as stack, raw_receivers() as (dripping, flooding):
        api = Api(stack.web.url)
        put_endpoint(api, "healthy", healthy, SECRETS[0], types=["lead.sold"])
        for name, rx in (("dripping", dripping), ("flooding", flooding)):
            resp = api.http.put(
                f"{api.base}/v1/admin/event-endpoints/{name}",
                json={"url": rx.url, "secret": SECRETS[1], "types": ["lead.sold"]},
                headers=api.admin,
            )
            assert resp.status_code == 200, resp.text
        buyer_server.add("acme")
        key = api.put_publisher("surge", commission_pct="10")
        api.put_buyer("acme", buyer_server.url("acme"), price="20.00")
        api.settle_config()
        stack.worker("floodgate")  # the Procfile's `worker`: settlements
        events = stack.worker("floodgate-events")  # its `events`: deliveries
        local = threading.local()
        sessions: list[requests.Session] = []

        def post(n: int) -> str:
            if getattr(local, "s", None) is None:
                local.s = requests.Session()
                sessions.append(local.s)
            resp = api.post_lead(key, {"lead_id": f"h{n}", "state": "TX"}, local.s)
            assert resp.status_code == 200, resp.text
            return str(resp.json()["status"])

        # Live traffic while the first deliveries drip: a few leads first, the rest once the
        # dripping receiver holds a delivery open.
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(post, range(10)))
            wait_until(lambda: dripping.requests > 0, timeout=60, what="a delivery to the dripping receiver")
            statuses += list(pool.map(post, range(10, LEADS)))
        for s in sessions:  # closed: their idle keep-alive connections would hold gunicorn's stop
            s.close()
        assert statuses == ["sold"] * LEADS

        def settled() -> bool:
            return all(api.get(f"/v1/admin/leads/h{n}").status_code == 200 for n in range(LEADS))

        wait_until(settled, timeout=60, interval=0.5, what="every lead settled while a receiver drips")
        wait_until(lambda: len(lead_ids(healthy)) == LEADS, timeout=60, what="the healthy endpoint's events")
        wait_until(lambda: flooding.requests >= 1, timeout=30, what="a delivery to the flooding receiver")

        def attempts(endpoint: str) -> list[dict]:
            found = api.get(f"/v1/admin/events?endpoint_id={endpoint}&type=lead.sold").json()["events"]
            return [a for e in found for a in e["attempts"] if a["endpoint_id"] == endpoint]

        wait_until(lambda: attempts("dripping"), timeout=30, what="the dripping receiver's attempts written")
        assert all(a["error"] and "no full reply" in a["error"] for a in attempts("dripping"))
        wait_until(lambda: attempts("flooding"), timeout=30, what="the flooding receiver's attempts written")
        assert all(a["status_code"] == 200 and a["error"] is None for a in attempts("flooding"))
        # Floodgate read 64 KiB of each 600 MB reply and hung up: the socket buffers hold the rest.
        assert flooding.sent < flooding.requests * 16 * 1024 * 1024
        peak = peak_rss_mb(events.pid)
        print(f"events worker: peak RSS {peak:.0f} MB after {flooding.requests} flooded replies")  # noqa: T201 (-s)
        assert events.alive() and peak < 400
        api.http.close()
    healthy.close()
