"""The admin token, checked and counted the same way on every path that takes it: the bearer
header (admin API and /ops), `/ops?token=` and the /ops login form. Each client address has
LOGIN_FAILURES tries per LOGIN_WINDOW_S; docs/security.md "Guessing the admin token". Buyer
API keys are counted the same way, on a counter of their own (web/buyer_api.py)."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import time
from collections.abc import Callable
from typing import TypeVar

from flask import request

from webhooks import services
from webhooks.errors import FloodgateError, TooManyAttempts, Unauthorized
from webhooks.formats.validate import bearer
from webhooks.storage.live import keys

# The token is long and random: this only keeps a guesser from trying at the speed of the network.
LOGIN_FAILURES, LOGIN_WINDOW_S = 20, 300

T = TypeVar("T")


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


def address_digest() -> str:
    """The SHA-256 of the client's address (`_address`): what its tries are counted under."""
    return hashlib.sha256(_address().encode()).hexdigest()


def tried(counter: str, check: Callable[[], T | None], what: str) -> T | None:
    """`check()`, taking one of this address' tries (`counter`, its key) first: a true answer
    gives it back, so that only wrong credentials use them up, and many requests at once cannot
    check more than LOGIN_FAILURES wrong ones. When none is left, nothing is checked and
    TooManyAttempts is raised (naming `what` was tried), the right credential included: an
    answer that told it apart would let a guesser go on at full speed. Other addresses keep
    their own tries."""
    store = services.current().store
    window_end = int(time.time()) + LOGIN_WINDOW_S
    if store.adjust_counter(counter, 1, window_end) > LOGIN_FAILURES:
        ttl = store.redis.ttl(counter)
        raise TooManyAttempts(ttl if isinstance(ttl, int) and ttl > 0 else LOGIN_WINDOW_S, what)
    found = check()
    if found:
        store.adjust_counter(counter, -1, window_end)
    return found


def attempt(presented: str) -> bool:
    """Whether `presented` is the admin token, counted as `tried` says."""
    token = services.current().config.admin_token
    if not token:
        return False
    counter = keys.ops_login_failures(address_digest())
    return bool(tried(counter, lambda: hmac.compare_digest(presented.encode(), token.encode()), "admin tokens"))


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
