"""The admin token, checked and counted the same way on every path that takes it: the bearer
header (admin API and /ops), `/ops?token=` and the /ops login form. Each client address has
LOGIN_FAILURES tries per LOGIN_WINDOW_S; docs/security.md "Guessing the admin token"."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import time

from flask import request

from webhooks import services
from webhooks.errors import FloodgateError, TooManyAttempts, Unauthorized
from webhooks.formats.validate import bearer
from webhooks.storage.live import keys

# The token is long and random: this only keeps a guesser from trying at the speed of the network.
LOGIN_FAILURES, LOGIN_WINDOW_S = 20, 300


def configured() -> bool:
    """Whether ADMIN_TOKEN is set (without it no token is right)."""
    return bool(services.current().config.admin_token)


def _address() -> str:
    """Whose tries these are: the client's address, an IPv6 one by its /64 (one host is given a
    /64 and may send from any address in it), an IPv4-mapped one as the IPv4 address."""
    raw = request.remote_addr or "-"
    try:
        ip = ipaddress.ip_address(raw)
    except ValueError:
        return raw[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def attempt(presented: str) -> bool:
    """Whether `presented` is the admin token, taking one of this address' tries first: a
    right token gives it back, so that only wrong ones use them up, and many requests at once
    cannot compare more than LOGIN_FAILURES wrong ones. When none is left, nothing is compared
    and TooManyAttempts is raised, the right token included: an answer that told it apart
    would let a guesser go on at full speed. Other addresses keep their own tries."""
    token = services.current().config.admin_token
    if not token:
        return False
    store = services.current().store
    key = keys.ops_login_failures(hashlib.sha256(_address().encode()).hexdigest())
    window_end = int(time.time()) + LOGIN_WINDOW_S
    if store.adjust_counter(key, 1, window_end) > LOGIN_FAILURES:
        ttl = store.redis.ttl(key)
        raise TooManyAttempts(ttl if isinstance(ttl, int) and ttl > 0 else LOGIN_WINDOW_S)
    if hmac.compare_digest(presented.encode(), token.encode()):
        store.adjust_counter(key, -1, window_end)
        return True
    return False


def refuse() -> None:
    """Raise the admin API's answer to a request without the admin token: 503 admin_disabled
    when ADMIN_TOKEN is not set, else 401."""
    if not configured():
        raise FloodgateError("ADMIN_TOKEN is not set; the admin API is disabled", status=503, code="admin_disabled")
    raise Unauthorized("missing or wrong admin token")


def require_bearer() -> None:
    """Pass a request whose `Authorization: Bearer` is the admin token (counted); else refuse."""
    presented = bearer(request.headers.get("Authorization", ""))
    if not (configured() and presented and attempt(presented)):
        refuse()
