"""The admin token, checked and counted the same way on every path that takes it: the bearer
header (admin API and /ops), `/ops?token=` and the /ops login form. Each client address has
LOGIN_FAILURES tries per LOGIN_WINDOW_S; docs/security.md "Guessing the admin token". Buyer
API keys are counted the same way, on a counter of their own (web/buyer_api.py).

An operator user's login (`sign_in`: e-mail, password and, for an owner or an admin, a TOTP
code) takes a try off two counters: the address' own, the admin token's (LOGIN_FAILURES of any
credential, whatever account they name), and one of the account *from that address*
(ACCOUNT_FAILURES). An account is never locked as a whole: a guesser's failures lock it for the
guesser's address only, and the right password (and code) from another address still opens a
session. A wrong password and a wrong code are both failures; a right login gives its tries
back. A code is taken once: its time step is kept in Redis while it could still be valid."""

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
from webhooks.people import accounts
from webhooks.storage.live import keys
from webhooks.storage.records.models import User

# The token is long and random: this only keeps a guesser from trying at the speed of the network.
LOGIN_FAILURES, LOGIN_WINDOW_S = 20, 300
ACCOUNT_FAILURES = 5  # wrong tries of one operator user's account from one address per LOGIN_WINDOW_S
CODE_KEPT_S = 120  # a TOTP step of 30 s, valid one step either side: 90 s, and some margin

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


def _take(counter: str, limit: int, what: str) -> None:
    """One try off `counter`; TooManyAttempts (naming `what`) when it had none left."""
    store = services.current().store
    if store.adjust_counter(counter, 1, int(time.time()) + LOGIN_WINDOW_S) > limit:
        ttl = store.redis.ttl(counter)
        raise TooManyAttempts(ttl if isinstance(ttl, int) and ttl > 0 else LOGIN_WINDOW_S, what)


def sign_in(
    email: str, password: str, code: str, allowed: frozenset[accounts.Role] = accounts.OPERATOR_ROLES
) -> User | None:
    """The user of one of the `allowed` roles (the operators' for /ops, the portals' for
    /portal) whose e-mail, password and (owner, admin) current TOTP code these are; None for
    anything wrong, a user of another role included, without saying what. TooManyAttempts when this address used up
    its tries, of any credential or of this account, and then nothing is checked."""
    address = address_digest()
    per_address = keys.ops_login_failures(address)
    per_account = keys.user_login_failures(accounts.digest(email.strip().lower()[:254]), address)
    _take(per_address, LOGIN_FAILURES, "logins")
    _take(per_account, ACCOUNT_FAILURES, "logins")
    user = accounts.password_holder(email, password)
    if user is None or accounts.Role(user.role) not in allowed or not _second_factor(user, code.strip()):
        return None  # a user of another login's roles (/ops or /portal) is refused as a wrong password
    store, window_end = services.current().store, int(time.time()) + LOGIN_WINDOW_S
    for counter in (per_address, per_account):
        store.adjust_counter(counter, -1, window_end)
    return user


def _second_factor(user: User, code: str) -> bool:
    """Whether the user needs no code, or `code` is right and not taken before."""
    if accounts.Role(user.role) not in accounts.TOTP_ROLES:
        return True
    step = accounts.code_matches(user, code)
    return step is not None and code_taken(user, step)


def code_taken(user: User, step: int) -> bool:
    """Mark the user's TOTP time step used; False when it was already."""
    return bool(services.current().store.redis.set(keys.user_totp_used(user.id, step), "1", nx=True, ex=CODE_KEPT_S))
