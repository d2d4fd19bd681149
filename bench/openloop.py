"""Open-loop load: POST leads at a constant rate whatever the server answers, and measure each
latency from the moment the request was due (so a slow server cannot slow the generator down
and hide its own queueing: no coordinated omission). Runs as its own process:

    python -m bench.openloop URL API_KEY RATE SECONDS  ->  one JSON line on stdout
    python -m bench.openloop payments URL FILE RATE     ->  the same, for the payment
        deliveries listed in FILE (JSON: [[provider, headers, body], ...]), sent in order
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json
import socket
import sys
import time
from collections.abc import Callable, Iterable
from functools import partial
from urllib.parse import urlsplit

import gevent
from gevent.lock import BoundedSemaphore

from bench.common import percentiles

# The generator shares the machine's two cores with what it measures, so each request costs it
# as little as it can: its bytes made once, on keep-alive sockets of its own, with no HTTP
# client library (with geventhttpclient it took 0.49-0.67 ms of CPU per lead, with this
# 0.33-0.53 ms; bench/REPORT.md part 33).


CONNECTIONS = 1000  # requests in flight at most; the others wait, their latency counted from when due


class _Stale(Exception):
    """A kept connection the server had closed while it idled: the request got no byte back."""


class Http:
    """Keep-alive connections to one HTTP/1.1 server, one per request in flight (CONNECTIONS
    at most). Every server the benches run answers with a Content-Length."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.addr = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.host = f"{self.addr[0]}:{self.addr[1]}".encode()
        self.idle: list[socket.socket] = []
        self.slots = BoundedSemaphore(CONNECTIONS)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.addr, timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def post(self, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        """(status, body) of one POST, the whole exchange within 10 s. On a kept connection
        the server had closed (end of file or a reset before any byte of an answer) the
        request goes again on a new one; any other failure is the caller's."""
        head = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
        request = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
            path.encode(),
            self.host,
            len(body),
            head,
            body,
        )
        with gevent.Timeout(10), self.slots:
            while self.idle:
                try:
                    return self._exchange(self.idle.pop(), request, kept=True)
                except _Stale:
                    continue
            return self._exchange(self._connect(), request, kept=False)

    def _exchange(self, sock: socket.socket, request: bytes, kept: bool) -> tuple[int, bytes]:
        try:
            try:
                sock.sendall(request)
                chunk = sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if not chunk:
                raise _Stale() if kept else ConnectionError("closed before an answer")
            buf = chunk
            while (end := buf.find(b"\r\n\r\n")) < 0:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed in an answer's head")
                buf += chunk
            status_line, *lines = buf[:end].split(b"\r\n")
            status = int(status_line.split(b" ", 2)[1])
            fields = {}
            for line in lines:
                name, _, value = line.partition(b":")
                fields[name.strip().lower()] = value.strip()
            length = int(fields[b"content-length"])
            body = buf[end + 4 :]
            while len(body) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed in an answer's body")
                body += chunk
        except BaseException:
            sock.close()
            raise
        if fields.get(b"connection", b"").lower() == b"close":
            sock.close()
        else:
            self.idle.append(sock)
        return status, body[:length]


def paced(rate: float, requests: Iterable[Callable[[], str]]) -> dict:
    """Start `requests` (each returns its answer's status key, or raises) at `rate` per second,
    each in its own greenlet whatever the others' answers; a latency counts from when its request
    was due, answered or not (a request given up on counts its 10 s)."""
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    answered = 0
    start = time.perf_counter() + 0.2

    def one(request: Callable[[], str], due: float) -> None:
        nonlocal answered
        try:
            key = request()
            answered += 1
        except (Exception, gevent.Timeout) as exc:
            key = type(exc).__name__
        latencies.append((time.perf_counter() - due) * 1000)
        statuses[key] = statuses.get(key, 0) + 1

    greenlets = []
    for i, request in enumerate(requests):
        due = start + i / rate
        if (wait := due - time.perf_counter()) > 0:
            gevent.sleep(wait)
        greenlets.append(gevent.spawn(one, request, due))
    gevent.joinall(greenlets, timeout=30)
    elapsed = time.perf_counter() - start
    return {
        "offered_rate": rate,
        "sent": len(greenlets),
        "completed": len(latencies),
        "answered": answered,
        "statuses": statuses,
        "achieved_rate": round(answered / elapsed, 1),  # answers per second
        **{k + "_ms": v for k, v in percentiles(latencies).items()},
    }


def run(url: str, api_key: str, rate: float, seconds: float) -> dict:
    """Leads at `rate` per second for `seconds`; statuses are the answers' `status` fields."""
    http = Http(url)
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    tag = f"ol{int(time.time())}"

    def lead(i: int) -> str:
        body = json.dumps({"lead_id": f"{tag}-{i}", "state": "TX", "email": "ada@example.com"})
        status, data = http.post("/v1/leads", body.encode(), headers)
        return str(status) if status != 200 else json.loads(data)["status"]

    return {**paced(rate, (partial(lead, i) for i in range(int(rate * seconds)))), "seconds": seconds}


def run_payments(url: str, deliveries: list, rate: float) -> dict:
    """Send `deliveries` at `rate` per second; statuses are the answers' `status` fields."""
    http = Http(url)

    def delivery(provider: str, headers: dict, body: str) -> str:
        status, data = http.post(
            f"/v1/webhooks/{provider}", body.encode(), {"Content-Type": "application/json", **headers}
        )
        return json.loads(data).get("status") or str(status) if status in (200, 409) else str(status)

    sent = (partial(delivery, *d) for d in deliveries)
    return {**paced(rate, sent), "seconds": round(len(deliveries) / rate, 1)}


if __name__ == "__main__":
    if sys.argv[1] == "payments":
        with open(sys.argv[3]) as f:
            print(json.dumps(run_payments(sys.argv[2], json.load(f), float(sys.argv[4]))))
    else:
        print(json.dumps(run(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))))
