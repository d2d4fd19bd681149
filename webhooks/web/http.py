"""HTTP plumbing shared by the blueprints: JSON errors (a page for a browser on /ops and /portal),
body parsing, id converter, request ids."""

from __future__ import annotations

import io
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from flask import Flask, Response, current_app, jsonify, render_template_string, request, stream_with_context
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException
from werkzeug.routing import BaseConverter

from webhooks.errors import FloodgateError, InvalidLead, ValidationError
from webhooks.formats import strictjson
from webhooks.formats.validate import is_id
from webhooks.logs import REQUEST_ID
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.records.db import UNAVAILABLE_ERRORS

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
}


class IdConverter(BaseConverter):
    """Ids in paths are [A-Za-z0-9._-]{1,64}; anything else does not match the route (404)."""

    regex = r"[A-Za-z0-9._-]{1,64}"


# Bulk admin bodies: a suppression list's entries, up to 10,000 values a call (sha256 hex in
# JSON: about 670 KB), under this larger cap; every other body under MAX_BODY_BYTES.
BULK_PATH = re.compile(r"/v1/admin/suppression-lists/[A-Za-z0-9._-]{1,64}/entries")
BULK_BODY_BYTES = 1024 * 1024
# A file of suppression entries uploaded from the console: the file at most UPLOAD_FILE_BYTES
# (the page says so when it is over), the body twice that, so that a file a little over gets
# the page's message rather than a bare 413.
UPLOAD_PATH = re.compile(r"/ops/suppression/[A-Za-z0-9._-]{1,64}/upload")
UPLOAD_FILE_BYTES = 2 * 1024 * 1024
UPLOAD_BODY_BYTES = 2 * UPLOAD_FILE_BYTES
# Where RequestIds leaves the request's id in the WSGI environ.
REQUEST_ID_KEY = "floodgate.request_id"


def body_limit(path: str, default: int) -> int:
    """The body cap of a request to `path` (fullmatch: `$` would pass a trailing newline)."""
    if BULK_PATH.fullmatch(path):
        return max(default, BULK_BODY_BYTES)
    return max(default, UPLOAD_BODY_BYTES) if UPLOAD_PATH.fullmatch(path) else default


class BodyLimit:
    """WSGI middleware: a body without Content-Length (chunked) is read here, at most `limit`
    + 1 bytes, and handed on with its length, so that MAX_CONTENT_LENGTH refuses an oversized
    one with 413 exactly as it refuses a declared one. Werkzeug alone stops reading such a
    stream at the limit and passes its first 256 KiB on as if they were the whole body."""

    def __init__(self, app: WSGIApplication, limit: int) -> None:
        self.app, self.limit = app, limit

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("CONTENT_LENGTH", "") == "" and "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            stream, chunks, size = environ["wsgi.input"], [], 0
            limit = body_limit(environ.get("PATH_INFO", ""), self.limit)
            while size <= limit:
                chunk = stream.read(min(64 * 1024, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            # From here on the body is a buffered one of known length (Werkzeug ignores
            # CONTENT_LENGTH while Transfer-Encoding says chunked); limit + 1 means "too long".
            environ["wsgi.input"] = io.BytesIO(b"".join(chunks))
            environ["CONTENT_LENGTH"] = str(size)
            del environ["HTTP_TRANSFER_ENCODING"]
        return self.app(environ, start_response)


class RequestIds:
    """WSGI middleware: every request's id, before Flask sees it. A caller's X-Request-Id is
    kept only when it is an id (docs/api.md, Conventions): it is echoed, logged and carried
    into RQ jobs, whose dashboard renders their metadata unescaped. The id is in the environ
    (`request_id()`), in the log context (logs.REQUEST_ID) while the app runs, and on the
    answer. One layer, not three Flask hooks: Flask's dispatch of them cost more than the id
    (an answer through every hook: 89-99 µs against 107-108, bench/REPORT.md part 40)."""

    def __init__(self, app: WSGIApplication) -> None:
        self.app = app

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        rid = environ.get("HTTP_X_REQUEST_ID", "")
        if not is_id(rid):
            rid = secrets.token_hex(16)  # 32 hex digits, as a uuid4 in a third of the time
        environ[REQUEST_ID_KEY] = rid
        echo = ("X-Request-Id", rid)

        def start(
            status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None
        ) -> Callable[[bytes], object]:
            headers.append(echo)
            return start_response(status, headers, exc_info)

        token = REQUEST_ID.set(rid)
        try:
            return self.app(environ, start)
        finally:
            REQUEST_ID.reset(token)


def request_id() -> str:
    """The id of the request being served (RequestIds)."""
    return str(request.environ[REQUEST_ID_KEY])


def error(code: str, message: str, status: int) -> Response:
    resp = jsonify({"error": {"code": code, "message": message}})
    resp.status_code = status
    return resp


def query_arg(name: str) -> str | None:
    """`?name=` as sent; None when it is absent or empty. An empty field is no filter: a form
    sends its fields left empty as `name=`, and docs/api.md writes the lists' URLs so."""
    return request.args.get(name) or None


def csv_response(rows: Iterator[str], name: str) -> Response:
    """A streamed CSV download named `name` (never cached: it holds the ledger's figures)."""
    return Response(
        stream_with_context(rows),
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{name}"', "Cache-Control": "no-store"},
    )


def json_body() -> object:
    """The request body as strict JSON (400 invalid_json); its size is already capped (413)."""
    return strictjson.loads(request.get_data(cache=True))


def patch_body(code: str) -> dict[str, object]:
    """A PATCH's body: a JSON merge patch of a stored object, so an object (400 otherwise)."""
    body = json_body()
    if not isinstance(body, dict):
        raise ValidationError(code, "body", "must be a JSON object (a JSON merge patch, RFC 7396)")
    return body


# The pages people read in a browser (the console, the set-up page and the portals): an error
# there is a page saying what happened with a way back, not a JSON body with none.
BROWSER_PAGES = ("/ops/", "/portal/")
ERROR_PAGE = """{% extends "base.html" %}{% set bare = True %}
{% block title %}{{ status }} · Floodgate{% endblock %}
{% block body %}<h1>{{ title }}</h1><div class="errors" role="alert" data-error-code="{{ code }}">{{ message }}</div>
<p><a href="{{ back }}">Back to {{ back }}</a></p>{% endblock %}"""
ERROR_TITLES = {401: "Log in first", 403: "Not allowed", 404: "Not found", 429: "Too many tries"}


def _wants_page() -> bool:
    """A browser's request of a console or portal page (it prefers HTML to anything else)."""
    preferred = request.accept_mimetypes.best_match(["application/json", "text/html"])
    return (request.path + "/").startswith(BROWSER_PAGES) and preferred == "text/html"


def error_page(code: str, message: str, status: int) -> Response:
    """The HTML page of an error (ERROR_PAGE), linking back to the console or portal's start."""
    back = "/portal" if request.path.startswith("/portal") else "/ops"
    title = ERROR_TITLES.get(status, "Refused" if status < 500 else "Something went wrong")
    html = render_template_string(ERROR_PAGE, status=status, title=title, code=code, message=message, back=back)
    return Response(html, status=status, mimetype="text/html", headers={"Cache-Control": "no-store"})


def _on_floodgate_error(exc: FloodgateError) -> ResponseReturnValue:
    resp = error_page(exc.code, exc.message, exc.status) if _wants_page() else error(exc.code, exc.message, exc.status)
    if isinstance(exc, InvalidLead):  # every failing field of the publisher's spec, named
        resp = jsonify({"error": {"code": exc.code, "message": exc.message, "fields": exc.fields}})
        resp.status_code = exc.status
    retry_after = getattr(exc, "retry_after_s", None)
    if retry_after is not None:
        resp.headers["Retry-After"] = str(max(1, retry_after))
    return resp


def _on_http_exception(exc: HTTPException) -> ResponseReturnValue:
    code = _HTTP_CODES.get(exc.code or 500, "http_error")
    if exc.code == 413:
        limit = body_limit(request.path, current_app.config["MAX_CONTENT_LENGTH"])
        message = f"request body exceeds {limit // 1024} KiB"
    else:
        message = exc.description or code
    return (error_page if _wants_page() else error)(code, message, exc.code or 500)


def _on_redis_down(exc: Exception) -> ResponseReturnValue:
    log.warning("redis unavailable: %s", exc)
    return error("unavailable", "Redis is unavailable; nothing was done, retry later", 503)


def _on_db_down(exc: Exception) -> ResponseReturnValue:
    log.warning("database unavailable: %s", exc)
    return error("unavailable", "the database is unavailable; nothing was done, retry later", 503)


def _on_unexpected(exc: Exception) -> ResponseReturnValue:
    log.exception("unhandled error")
    return error("internal_error", "internal error", 500)


def init_app(app: Flask) -> None:
    app.wsgi_app = RequestIds(BodyLimit(app.wsgi_app, app.config["MAX_CONTENT_LENGTH"]))  # type: ignore[method-assign]
    app.url_map.converters["id"] = IdConverter
    app.register_error_handler(FloodgateError, _on_floodgate_error)
    app.register_error_handler(HTTPException, _on_http_exception)
    for exc in REDIS_DOWN:
        app.register_error_handler(exc, _on_redis_down)
    for db_exc in UNAVAILABLE_ERRORS:
        app.register_error_handler(db_exc, _on_db_down)
    app.register_error_handler(Exception, _on_unexpected)
