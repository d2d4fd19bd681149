"""An operator user's login (`POST /ops/login` with e-mail, password and, for an owner or an
admin, a TOTP code), its tries counted on two counters (docs/security.md "Operator users"):

- per client address, the admin token's own counter (webhooks/web/logins.py): LOGIN_FAILURES
  wrong tries of any credential from one address per LOGIN_WINDOW_S, whatever account they name;
- per account *and* address: ACCOUNT_FAILURES wrong tries of one account from one address.

An account is never locked as a whole: a guesser's failures lock that account for the
guesser's address only, and the right password (and code) from another address still opens a
session. A wrong password and a wrong code are both failures; a right one gives its tries
back. A code is taken once: its time step is kept in Redis for as long as it could be valid."""

from __future__ import annotations

import time

from webhooks import services
from webhooks.errors import TooManyAttempts
from webhooks.storage.live import keys
from webhooks.storage.records.models import User
from webhooks.web import logins
from webhooks.web.people import accounts

ACCOUNT_FAILURES = 5  # wrong tries of one account from one address per LOGIN_WINDOW_S
CODE_KEPT_S = 120  # a step of 30 s, valid one step either side: 90 s, and some margin


def _take(counter: str, limit: int) -> None:
    """One try off `counter`; TooManyAttempts when it had none left."""
    store = services.current().store
    if store.adjust_counter(counter, 1, int(time.time()) + logins.LOGIN_WINDOW_S) > limit:
        ttl = store.redis.ttl(counter)
        raise TooManyAttempts(ttl if isinstance(ttl, int) and ttl > 0 else logins.LOGIN_WINDOW_S, "logins")


def _give_back(*counters: str) -> None:
    store = services.current().store
    for counter in counters:
        store.adjust_counter(counter, -1, int(time.time()) + logins.LOGIN_WINDOW_S)


def sign_in(email: str, password: str, code: str) -> User | None:
    """The user whose e-mail, password and (owner, admin) current TOTP code these are; None
    for anything wrong, without saying what. TooManyAttempts when this address used up its
    tries, of any account or of this one, and then nothing is checked."""
    address = logins.address_digest()
    per_address = keys.ops_login_failures(address)
    per_account = keys.user_login_failures(accounts.digest(email.strip().lower()[:254]), address)
    _take(per_address, logins.LOGIN_FAILURES)
    _take(per_account, ACCOUNT_FAILURES)
    user = accounts.password_holder(email, password)
    if user is None or not _second_factor(user, code.strip()):
        return None
    _give_back(per_address, per_account)
    return user


def _second_factor(user: User, code: str) -> bool:
    """Whether the user needs no code, or `code` is right and not used before."""
    if accounts.Role(user.role) not in accounts.TOTP_ROLES:
        return True
    step = accounts.code_matches(user, code)
    if step is None:
        return False
    first = services.current().store.redis.set(keys.user_totp_used(user.id, step), "1", nx=True, ex=CODE_KEPT_S)
    return bool(first)
