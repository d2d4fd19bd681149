"""A restrictive Content-Security-Policy on the operator pages (/ops and the RQ dashboard).

The /ops page runs no script at all. rq-dashboard runs its own static scripts, one inline
block of configuration (given a per-response nonce here), and compiles underscore templates
with `new Function` ('unsafe-eval'). It renders job metadata without escaping: with this
policy an injected `<img onerror=...>` or `<script>` in such data does not run (no
'unsafe-inline' for scripts, so no inline event handlers), and nothing may load from or post
to another origin.
"""

from __future__ import annotations

import secrets

from flask import Flask, Response, request

PREFIX = "/ops"
# The dashboard's one inline script tag, as its base.html writes it.
_INLINE_SCRIPT = b'<script type="text/javascript">'
_COMMON = (
    "default-src 'none'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; font-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
PAGE_POLICY = _COMMON + "; script-src 'none'"


def dashboard_policy(nonce: str) -> str:
    return _COMMON + f"; script-src 'self' 'nonce-{nonce}' 'unsafe-eval'; connect-src 'self'"


def _is_ops(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def _protect(resp: Response) -> Response:
    if not _is_ops(request.path):
        return resp
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["X-Frame-Options"] = "DENY"
    if request.path.startswith(PREFIX + "/rq") and resp.mimetype == "text/html" and not resp.direct_passthrough:
        nonce = secrets.token_urlsafe(16)
        body = resp.get_data()
        resp.set_data(body.replace(_INLINE_SCRIPT, b'<script type="text/javascript" nonce="%s">' % nonce.encode()))
        resp.headers["Content-Security-Policy"] = dashboard_policy(nonce)
    else:
        resp.headers["Content-Security-Policy"] = PAGE_POLICY
    return resp


def init_app(app: Flask) -> None:
    app.after_request(_protect)
