"""A buyer to try Floodgate with (`flask --app wsgi demo-buyer`, or `scripts/run --demo`):
accepts every lead posted to /<name>, counts each Idempotency-Key once, and bids on pings at
/<name>/ping. For the quick start and docs/buyers.md; never for production."""

from __future__ import annotations

import json
import logging
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: set[str] = set()
    lock = threading.Lock()

    def log_message(self, fmt: str, *args: Any) -> None:
        log.info("demo buyer: " + fmt, *args)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/").endswith("/ping"):
            self._answer({"price": f"{random.uniform(5, 15):.2f}", "bid_id": f"bid-{random.randrange(10**9)}"})
            return
        key = self.headers.get("Idempotency-Key", "")
        with self.lock:
            again = key in self.seen
            self.seen.add(key)
        log.info("demo buyer: %s lead %s (%d bytes)%s", self.path, key, len(raw), " again" if again else "")
        self._answer({"accepted": True, "result": "success"})

    def _answer(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve(host: str, port: int) -> None:
    """Serve until interrupted."""
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    try:
        server.serve_forever()
    finally:
        server.server_close()
