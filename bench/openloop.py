"""Open-loop load: POST leads at a constant rate whatever the server answers, and measure each
latency from the moment the request was due (so a slow server cannot slow the generator down
and hide its own queueing: no coordinated omission). Runs as its own process:

    python -m bench.openloop URL API_KEY RATE SECONDS  ->  one JSON line on stdout
    python -m bench.openloop payments URL FILE RATE     ->  the same, for the payment
        deliveries listed in FILE (JSON: [[provider, headers, body], ...]), sent in order
"""

from __future__ import annotations

import errno
import json
import select
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from bench.common import percentiles

# The generator shares the machine's two cores with what it measures, so each request costs it
# as little as it can: its bytes made once, on keep-alive sockets of its own, driven by one
# epoll loop with no event-loop library and no HTTP client (geventhttpclient took 0.49-0.67 ms
# of CPU per lead, gevent with plain sockets 0.33-0.53 ms; bench/REPORT.md parts 33 and 35).

CONNECTIONS = 1000  # requests in flight at most; the others wait, their latency counted from when due
TIMEOUT_S = 10.0  # a request not answered this long after it was due is given up on
DRAIN_S = 30.0  # after the last request is due, how long the answers are waited for at most

Answer = Callable[[int, bytes], str]  # (HTTP status, body) -> the answer's status key


def post(url: str, path: str, body: bytes, headers: dict) -> bytes:
    """The bytes of one POST to `url`'s server."""
    parts = urlsplit(url)
    head = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
    return b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        path.encode(),
        parts.netloc.encode(),
        len(body),
        head,
        body,
    )


class Timeout(Exception):
    """No answer within TIMEOUT_S of the request's due time."""


class _Job:
    __slots__ = ("due", "request", "answer")

    def __init__(self, due: float, request: bytes, answer: Answer) -> None:
        self.due, self.request, self.answer = due, request, answer


class _Conn:
    """One keep-alive connection; `job` is the request it carries, None while it idles."""

    __slots__ = ("sock", "fd", "job", "out", "buf", "kept", "connecting")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.fd = sock, sock.fileno()
        self.job: _Job | None = None
        self.out = b""  # what is left to send of the request
        self.buf = b""  # what has come of the answer
        self.kept = False  # the connection served an earlier request
        self.connecting = True


class Engine:
    """Requests to one HTTP/1.1 server on keep-alive connections (CONNECTIONS at most), each
    latency counted from its request's due time. Every server the benches run answers with a
    Content-Length. A kept connection the server had closed while it idled (end of file or a
    reset before any byte of an answer) takes its request again on a new connection."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.addr = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.poller = select.epoll()
        self.conns: dict[int, _Conn] = {}
        self.idle: list[_Conn] = []
        self.waiting: deque[_Job] = deque()  # due, with every connection busy
        self.latencies: list[float] = []
        self.statuses: dict[str, int] = {}
        self.sent = self.answered = 0
        self._next_sweep = 0.0

    # --- the loop ------------------------------------------------------------------------------

    def start(self, job: _Job) -> None:
        self.sent += 1
        self._assign(job)

    def run_until(self, when: float) -> None:
        """Serve the connections until `when` (perf_counter seconds)."""
        while (left := when - time.perf_counter()) > 0:
            self._poll(min(left, 0.1))

    def drain(self, limit_s: float) -> None:
        """Serve the connections until every request is answered or given up, `limit_s` at most."""
        end = time.perf_counter() + limit_s
        while (self.waiting or any(c.job for c in self.conns.values())) and time.perf_counter() < end:
            self._poll(0.1)

    def _poll(self, timeout: float) -> None:
        for fd, events in self.poller.poll(timeout):
            conn = self.conns.get(fd)
            if conn is None:
                continue
            if events & select.EPOLLOUT:
                self._writable(conn)
            # the write may have closed it, and a new connection may have its descriptor by now
            if events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR) and self.conns.get(fd) is conn:
                self._readable(conn)
        now = time.perf_counter()
        if now >= self._next_sweep:
            self._next_sweep = now + 0.05
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Give up on every request due more than TIMEOUT_S ago."""
        while self.waiting and now - self.waiting[0].due >= TIMEOUT_S:
            self._finish(self.waiting.popleft(), Timeout.__name__)
        for conn in [c for c in self.conns.values() if c.job and now - c.job.due >= TIMEOUT_S]:
            job = conn.job
            self._close(conn)
            self._finish(job, Timeout.__name__)

    # --- one connection ------------------------------------------------------------------------

    def _assign(self, job: _Job) -> None:
        if self.idle:
            conn = self.idle.pop()
            conn.kept = True
        elif len(self.conns) < CONNECTIONS:
            try:
                conn = self._connect()
            except OSError as exc:
                self._finish(job, type(exc).__name__)
                return
        else:
            self.waiting.append(job)
            return
        conn.job, conn.out, conn.buf = job, job.request, b""
        if not conn.connecting:
            self._writable(conn)

    def _connect(self) -> _Conn:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex(self.addr)
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            raise OSError(err, errno.errorcode.get(err, "connect"))
        conn = _Conn(sock)
        self.conns[conn.fd] = conn
        self.poller.register(conn.fd, select.EPOLLIN | select.EPOLLOUT)
        return conn

    def _writable(self, conn: _Conn) -> None:
        if conn.connecting:
            if err := conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._fail(conn, ConnectionRefusedError.__name__ if err == errno.ECONNREFUSED else "OSError")
                return
            conn.connecting = False
        if not conn.out:
            self.poller.modify(conn.fd, select.EPOLLIN)
            return
        try:
            n = conn.sock.send(conn.out)
        except BlockingIOError:
            n = 0
        except OSError:  # reset, broken pipe
            self._lost(conn)
            return
        conn.out = conn.out[n:]
        self.poller.modify(conn.fd, select.EPOLLIN | (select.EPOLLOUT if conn.out else 0))

    def _readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:  # reset, refused
            data = b""
        if conn.job is None:  # an idle connection the server closed
            self._close(conn)
            return
        if not data:
            self._lost(conn)
            return
        conn.buf += data
        buf = conn.buf
        if (end := buf.find(b"\r\n\r\n")) < 0:
            return
        status_line, *lines = buf[:end].split(b"\r\n")
        fields = {}
        for line in lines:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        length = int(fields.get(b"content-length", b"0"))
        if len(buf) - end - 4 < length:
            return
        job, conn.job, conn.buf = conn.job, None, b""
        if fields.get(b"connection", b"").lower() == b"close":
            self._close(conn)
        else:
            self.idle.append(conn)
            if self.waiting:  # the oldest waiting request takes it
                self._assign(self.waiting.popleft())
        try:
            key = job.answer(int(status_line.split(b" ", 2)[1]), buf[end + 4 : end + 4 + length])
        except Exception as exc:
            self._finish(job, type(exc).__name__)
            return
        self.answered += 1
        self._finish(job, key)

    def _lost(self, conn: _Conn) -> None:
        """The connection ended (or was reset) before a whole answer came."""
        if conn.kept and not conn.buf:
            job = conn.job
            self._close(conn)
            self._assign(job)  # stale: the same request again, on a new connection
        else:
            self._fail(conn, ConnectionError.__name__)

    def _fail(self, conn: _Conn, key: str) -> None:
        job = conn.job
        self._close(conn)
        if job is not None:
            self._finish(job, key)

    def _close(self, conn: _Conn) -> None:
        if self.conns.get(conn.fd) is not conn:  # closed already; its descriptor may be reused
            return
        del self.conns[conn.fd]
        if conn in self.idle:
            self.idle.remove(conn)
        self.poller.unregister(conn.fd)
        conn.sock.close()
        conn.job = None
        if self.waiting and len(self.conns) < CONNECTIONS:
            self._assign(self.waiting.popleft())

    def _finish(self, job: _Job, key: str) -> None:
        self.latencies.append((time.perf_counter() - job.due) * 1000)
        self.statuses[key] = self.statuses.get(key, 0) + 1


def paced(url: str, rate: float, requests: Iterable[tuple[bytes, Answer]]) -> dict:
    """Send `requests` ((request bytes, answer reader) pairs; `post` makes the bytes) at `rate`
    per second, each when due whatever the others' answers; a latency counts from when its
    request was due, answered or not (a request given up on counts its 10 s)."""
    engine = Engine(url)
    start = time.perf_counter() + 0.2
    for i, (request, answer) in enumerate(requests):
        due = start + i / rate
        engine.run_until(due)
        engine.start(_Job(due, request, answer))
    engine.drain(DRAIN_S)
    elapsed = time.perf_counter() - start
    return {
        "offered_rate": rate,
        "sent": engine.sent,
        "completed": len(engine.latencies),
        "answered": engine.answered,
        "statuses": engine.statuses,
        "achieved_rate": round(engine.answered / elapsed, 1),  # answers per second
        **{k + "_ms": v for k, v in percentiles(engine.latencies).items()},
    }


def lead_answer(status: int, body: bytes) -> str:
    return str(status) if status != 200 else json.loads(body)["status"]


def payment_answer(status: int, body: bytes) -> str:
    return json.loads(body).get("status") or str(status) if status in (200, 409) else str(status)


def run(url: str, api_key: str, rate: float, seconds: float) -> dict:
    """Leads at `rate` per second for `seconds`; statuses are the answers' `status` fields."""
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    tag = f"ol{int(time.time())}"

    def leads() -> Iterable[tuple[bytes, Answer]]:
        for i in range(int(rate * seconds)):
            body = json.dumps({"lead_id": f"{tag}-{i}", "state": "TX", "email": "ada@example.com"})
            yield post(url, "/v1/leads", body.encode(), headers), lead_answer

    return {**paced(url, rate, leads()), "seconds": seconds}


def run_payments(url: str, deliveries: list, rate: float) -> dict:
    """Send `deliveries` at `rate` per second; statuses are the answers' `status` fields."""
    sent = (
        (
            post(url, f"/v1/webhooks/{provider}", body.encode(), {"Content-Type": "application/json", **headers}),
            payment_answer,
        )
        for provider, headers, body in deliveries
    )
    return {**paced(url, rate, sent), "seconds": round(len(deliveries) / rate, 1)}


if __name__ == "__main__":
    if sys.argv[1] == "payments":
        with open(sys.argv[3]) as f:
            print(json.dumps(run_payments(sys.argv[2], json.load(f), float(sys.argv[4]))))
    else:
        print(json.dumps(run(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))))
