"""A local stand-in for TrustedForm's Certificate API v4.0 (POST /<cert id>, HTTP Basic with
the user `API`, `api-version: 4.0`; docs/leads.md "TrustedForm's certificate API"), answering in the shapes
its documentation gives. What each certificate does is set per id: `yes` (200, outcome
success), `no` (200, outcome failure: the lead does not match), `expired` (404), `late`
(answers only when the test releases it), `broken` (500); `delay_s` slows every answer."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "tf_test_api_key_0123456789"


class TrustedFormStandIn:
    def __init__(self, api_key: str = API_KEY) -> None:
        self.api_key = api_key
        self.behaviour: dict[str, str] = {}
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()  # a `late` certificate answers once this is set
        self.delay_s = 0.0  # every answer waits this long first (a slow provider)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                cert = self.path.strip("/")
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests.append({"cert": cert, "headers": dict(self.headers), "body": json.loads(body or b"{}")})
                auth = self.headers.get("Authorization", "")
                if auth != "Basic " + base64.b64encode(f"API:{outer.api_key}".encode()).decode():
                    return self._answer(401, {"outcome": "error", "reason": "Unauthorized"})
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                mode = outer.behaviour.get(cert, "yes")
                if mode == "late":
                    outer.release.wait(30)
                if mode in ("yes", "late"):
                    sent = json.loads(body)
                    self._answer(
                        200,
                        {
                            "outcome": "success",
                            "reason": None,
                            "match_lead": {
                                **sent.get("match_lead", {}),
                                "result": {"email_match": True, "phone_match": None, "success": True},
                            },
                            "retain": {
                                **sent.get("retain", {}),
                                "results": {
                                    "expires_at": "2031-12-02T12:00:00Z",
                                    "masked_cert_url": None,
                                    "previously_retained": False,
                                },
                            },
                        },
                    )
                elif mode == "no":
                    self._answer(
                        200,
                        {
                            "outcome": "failure",
                            "reason": "Lead data does not match the certificate",
                            "match_lead": {
                                "email": "x",
                                "result": {"email_match": False, "phone_match": None, "success": False},
                            },
                        },
                    )
                elif mode == "expired":
                    self._answer(404, {"outcome": "error", "reason": "Certificate not found or expired"})
                else:
                    self._answer(500, {"outcome": "error", "reason": "Internal error"})

            def _answer(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client gone after its deadline

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
