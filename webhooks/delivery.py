"""Delivery of a lead to a buyer under a hard total deadline, and the outcome of API.md.

`requests`' own timeout is per socket operation, so a buyer trickling a byte a second would
hold the lead forever; the gevent.Timeout around the whole call is the real deadline (the web
process is always gevent-patched, see gunicorn.conf.py). The requests timeout stays as a
backstop for code run without gevent.
"""
from __future__ import annotations

import json
import logging
import time

import gevent
import requests
from requests.adapters import HTTPAdapter

log = logging.getLogger(__name__)

ACCEPTED, REJECTED, ERROR, TIMEOUT, CIRCUIT_OPEN = "accepted", "rejected", "error", "timeout", "circuit_open"


class _Deadline(Exception):
    """Raised by gevent.Timeout inside the delivery; never escapes `deliver`."""


def classify(status: int, content: bytes) -> str:
    if 200 <= status < 300:
        try:
            body = json.loads(content)
        except (ValueError, UnicodeDecodeError):
            return ERROR  # a non-JSON 2xx is an unreadable reply
        return ACCEPTED if isinstance(body, dict) and body.get("accepted") is True else REJECTED
    if 400 <= status < 500:
        return REJECTED
    return ERROR


class Deliverer:
    """One pooled HTTP session per process, shared by every greenlet."""

    def __init__(self, timeout_ms: int, pool_size: int = 100):
        self.timeout_s = timeout_ms / 1000
        self.session = requests.Session()
        adapter = HTTPAdapter(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.trust_env = False  # no proxy or netrc look-ups per call

    def deliver(self, url: str, body: bytes, idempotency_key: str) -> tuple[str, int]:
        """POST `body` to `url`; return (outcome, elapsed ms). Never raises for buyer faults."""
        started = time.perf_counter()
        headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key}
        try:
            with gevent.Timeout(self.timeout_s, _Deadline):
                resp = self.session.post(url, data=body, headers=headers, allow_redirects=False,
                                         timeout=(self.timeout_s, self.timeout_s))
                content = resp.content  # the whole reply must arrive inside the deadline
            outcome = classify(resp.status_code, content)
        except (_Deadline, requests.Timeout):
            outcome = TIMEOUT
        except (requests.RequestException, OSError, ValueError) as exc:
            log.info("delivery to %s failed: %s", url, exc)
            outcome = ERROR
        return outcome, int((time.perf_counter() - started) * 1000)
