"""Structured logs: one JSON object per line, carrying the request id of the HTTP request
(set by web/http.py in `REQUEST_ID`, a context variable, so per greenlet under gevent; also
returned as X-Request-Id) or, inside an RQ job, the request id the
job was enqueued with (job.meta["request_id"]), so a lead can be followed from intake to ledger.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import TextIO
from urllib.parse import unquote_plus

from rq import get_current_job

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id"}
# The user:password@ of any URL in a line (a buyer endpoint, DATABASE_URL, REDIS_URL in an
# error message): never written out, whichever code logged it.
# The scheme is bounded: a run of "a.a.a..." has a word boundary at every character.
_URL_CREDENTIALS = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]{0,31}://)[^\s/@\"'<>]+@")
# A query parameter (`?api_key=...`, `&token=...`): its value is dropped when its name says it
# is a secret. The name is bounded so that no line is scanned more than once per `?` or `&`.
_QUERY_PARAM = re.compile(r"([?&;])([^=&;\s\"'<>#]{1,64})=([^&;\s\"'<>#]*)")
_SECRET_NAME = re.compile(r"key|token|secret|pass|pwd|auth|sig|hash|credential|session|code", re.I)
REDACTED = "<redacted>"
REDACTED_URL = f"holds {REDACTED}: give the real value (or the URL exactly as GET shows it, to keep it)"


def _param(m: re.Match[str]) -> str:
    sep, name, value = m.groups()
    secret = value and _SECRET_NAME.search(unquote_plus(name))  # `api%5Fkey` is `api_key`
    return f"{sep}{name}={REDACTED}" if secret else m.group(0)


def redact_text(text: str) -> str:
    """`text` with every URL's user:password@ and every secret-looking query value removed:
    for log lines, and for error texts that are stored or shown (an event's `last_error`)."""
    return _QUERY_PARAM.sub(_param, _URL_CREDENTIALS.sub(r"\1" + REDACTED + "@", text))


SECRET_SHOWN_PREFIX = "****"
SECRET_SHOWN_CHARS = 4
# The last 4 characters are shown only when at least 12 others stay hidden: of a shorter
# secret nothing is shown (a 4-character one would be shown whole, a 6-character one nearly).
SECRET_HIDDEN_MIN = 12


def redact_secret(value: str) -> str:
    """A stored secret as a GET shows it (a buyer's header, an event endpoint's secret): its
    last 4 characters when it has 16 or more, else nothing of it; a PUT that sends this form
    back keeps the stored value."""
    if len(value) < SECRET_HIDDEN_MIN + SECRET_SHOWN_CHARS:
        return SECRET_SHOWN_PREFIX
    return SECRET_SHOWN_PREFIX + value[-SECRET_SHOWN_CHARS:]


def redact_url(url: str) -> str:
    """A URL as a GET, a log line or an error shows it (see redact_text): the value of every
    secret-looking query parameter (`api_key`, `token`, `sig`...) and any user:password@
    replaced by <redacted>; the stored and sent URL stays whole."""
    return redact_text(url)


def restore_url(given: str, stored: str | None) -> str | None:
    """The URL a PUT means: `stored` when `given` is the form GET shows of it (sent back
    unchanged, as with a buyer's headers), `given` when it holds no redacted value, else None
    (a redacted value that stands for nothing stored: the caller refuses it)."""
    if stored is not None and given == redact_url(stored):
        return stored
    return None if REDACTED in given else given


def current_request_id() -> str | None:
    """The request id of the HTTP request or RQ job this code runs for, if any."""
    rid = REQUEST_ID.get()
    if rid is not None:
        return rid
    job = get_current_job()
    return job.meta.get("request_id") if job is not None else None


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record (None outside requests and jobs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = current_request_id()
        return True


class JsonFormatter(logging.Formatter):
    """ts, level, logger, message, request_id, any `extra=` fields, and the exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
            "pid": record.process,
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return redact_text(json.dumps(entry, default=str))


class _JsonHandler(logging.StreamHandler[TextIO]):
    """Our stderr handler, told apart from others (pytest's, a host app's) by its class."""


def configure(level: str = "info") -> None:
    """Send the root logger's records to stderr as JSON lines. Idempotent: calling it again
    (once per app in tests) replaces our handler instead of duplicating lines."""
    handler = _JsonHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _JsonHandler)] + [handler]
    root.setLevel(level.upper())
