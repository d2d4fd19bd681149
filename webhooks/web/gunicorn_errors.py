"""gunicorn answers some requests itself, before the app sees them: a request line over
`limit_request_line` (414), too many or too large header fields (431), a request it cannot
parse (400). Its answer is an HTML page; docs/api.md wants the JSON error shape everywhere.
gunicorn has no hook for these pages, so `install()` (called by gunicorn.conf.py) replaces
the one function that writes them, `gunicorn.util.write_error`, which its workers look up at
call time. The message is fixed per status: gunicorn's own text may quote the request line,
which can carry `?token=`.
"""

from __future__ import annotations

import json
import socket

from gunicorn import util

ANSWERS = {
    400: ("bad_request", "the request could not be parsed"),
    403: ("forbidden", "request forbidden"),
    414: ("uri_too_long", "the request line is too long"),
    417: ("expectation_failed", "unsupported Expect header"),
    431: ("headers_too_large", "too many or too large header fields"),
    500: ("internal_error", "internal error"),
    501: ("not_implemented", "unsupported transfer coding"),
}


def write_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's util.write_error, answering the JSON error of docs/api.md."""
    code, message = ANSWERS.get(status_int, ("http_error", reason))
    body = json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


def install() -> None:
    util.write_error = write_error
