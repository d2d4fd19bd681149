"""Slow clients for the tests (and for bench/slow_clients.py, in c94b12a): many connections to a local server
that send a request's head at once, then its body slowly, from one thread with non-blocking
sockets. Bounded in count and in time, and to 127.0.0.1 only."""

from __future__ import annotations

import errno
import heapq
import itertools
import os
import resource
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class SlowRequest:
    """What one connection sends: `head`, then the first `burst` bytes of `body` as fast as
    the server reads them, then the rest one byte every interval."""

    head: bytes
    body: bytes
    burst: int = 0


def trickled(path: str, length: int = 100_000, **headers: str) -> SlowRequest:
    """A POST that declares `length` bytes of body and sends them one at a time."""
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n{extra}\r\n"
    return SlowRequest(head=head.encode(), body=b"x" * length)


def chunked(path: str, burst: int = 256 * 1024, **headers: str) -> SlowRequest:
    """A chunked POST that sends `burst` bytes of body in 64 KiB chunks at once, then more
    one-byte chunks, a byte at a time, and never its last chunk."""
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n{extra}\r\n"
    piece = 64 * 1024
    fast = b"".join(b"%x\r\n" % piece + b"x" * piece + b"\r\n" for _ in range(burst // piece))
    return SlowRequest(head=head.encode(), body=fast + b"1\r\nx\r\n" * 10_000, burst=len(fast))


def sockets_held(pids: list[int]) -> int:
    """Sockets the processes `pids` hold open (a server's accepted connections among them)."""
    count = 0
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                count += os.readlink(fd).startswith("socket:")
            except OSError:  # closed while listed
                pass
    return count


def raise_open_files(needed: int) -> int:
    """Raise this process's soft open-files limit towards its hard one; the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed and soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


class _Conn:
    __slots__ = ("sock", "request", "sent", "opened_at")

    def __init__(self, sock: socket.socket, request: SlowRequest) -> None:
        self.sock, self.request, self.sent, self.opened_at = sock, request, 0, time.monotonic()

    @property
    def wire(self) -> bytes:
        return self.request.head + self.request.body

    @property
    def fast_part(self) -> int:
        return len(self.request.head) + self.request.burst


class SlowClients:
    """`count` connections to 127.0.0.1:`port`, cycling through `requests`; a connection the
    server closes is opened again (the attacker keeps its count) until stop() or `max_s`."""

    def __init__(self, port: int, requests: list[SlowRequest], count: int, interval_s: float, max_s: float = 180):
        if count > 10_000:
            raise ValueError("at most 10,000 slow connections")
        self.port, self.count, self.interval_s, self.max_s = port, count, interval_s, max_s
        self._requests = itertools.cycle(requests)
        self._sel = selectors.DefaultSelector()
        self._due: list[tuple[float, int, _Conn]] = []  # (when, tie, conn): the next slow byte
        self._tie = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-clients", daemon=True)
        self.lock = threading.Lock()
        self.opened = 0  # connections opened in all
        self.open = 0  # open now
        self.closed_by_server = 0  # the server closed (or reset) them
        self.fast_sent = 0  # connections whose head and burst are all sent
        self.lifetimes: list[float] = []  # seconds from open to the server's close
        self.error: BaseException | None = None

    def __enter__(self) -> SlowClients:
        raise_open_files(self.count + 512)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()

    def _open(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        err = sock.connect_ex(("127.0.0.1", self.port))
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            raise OSError(err, "connect to 127.0.0.1 failed")
        conn = _Conn(sock, next(self._requests))
        self._sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        with self.lock:
            self.opened += 1
            self.open += 1

    def _close(self, conn: _Conn, by_server: bool) -> None:
        self._sel.unregister(conn.sock)
        conn.sock.close()
        with self.lock:
            self.open -= 1
            if by_server:
                self.closed_by_server += 1
                self.lifetimes.append(time.monotonic() - conn.opened_at)

    def _send(self, conn: _Conn, upto: int) -> None:
        """Send the wire bytes up to `upto`; once the fast part is out, one byte per interval."""
        trickling = conn.sent >= conn.fast_part
        try:
            conn.sent += conn.sock.send(conn.wire[conn.sent : upto])
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(conn, by_server=True)
            return
        if conn.sent >= conn.fast_part and conn.sent < len(conn.wire):
            if not trickling:
                self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
                with self.lock:
                    self.fast_sent += 1
            heapq.heappush(self._due, (time.monotonic() + self.interval_s, next(self._tie), conn))

    def _run(self) -> None:
        ends = time.monotonic() + self.max_s
        try:
            while not self._stop.is_set() and time.monotonic() < ends:
                while self.open < self.count:
                    self._open()
                for key, events in self._sel.select(timeout=0.05):
                    conn = key.data
                    if events & selectors.EVENT_READ:
                        try:
                            data = conn.sock.recv(65536)  # an answer (405, say) is read and ignored
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError:
                            data = b""
                        if not data:
                            self._close(conn, by_server=True)
                            continue
                    if events & selectors.EVENT_WRITE and conn.sent < conn.fast_part:
                        self._send(conn, conn.fast_part)
                now = time.monotonic()
                while self._due and self._due[0][0] <= now:
                    _, _, conn = heapq.heappop(self._due)
                    if conn.sock.fileno() != -1:
                        self._send(conn, conn.sent + 1)
        except BaseException as exc:  # seen by the test, not lost in a thread
            self.error = exc
