"""What each role of an operator user may do on /ops, checked at one place: the console's
session check (webhooks/web/sessions.py `require_admin`), before every console page, the user
pages and the RQ dashboard, so that no route checks a role of its own.

- `analyst`: reads; every change (any method but GET, HEAD, OPTIONS) is 403.
- `admin`: everything but the users (a change of the user pages is 403).
- `owner`: everything.

The admin token (bearer, or a session opened with it) is no user: it may do everything."""

from __future__ import annotations

from webhooks.errors import Forbidden
from webhooks.people.accounts import Role

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
USERS_ENDPOINTS = "people.users."  # the console's user pages (webhooks/web/people/pages.py)


def check(role: str, method: str, endpoint: str | None) -> None:
    """Pass when `role` may make this request (`method` to the route `endpoint`); else 403."""
    if method in SAFE_METHODS:
        return
    if not may_change(role):
        raise Forbidden("an analyst reads and changes nothing", code="read_only_role")
    if not manages_users(role) and (endpoint or "").startswith(USERS_ENDPOINTS):
        raise Forbidden("only an owner manages users", code="owner_only")


def manages_users(role: str | None) -> bool:
    """Whether `role` may invite and deactivate users (None: the admin token, which may), so
    that a page offers those forms only to whom they would not refuse."""
    return role is None or Role(role) is Role.OWNER


def may_change(role: str | None) -> bool:
    """Whether `role` may change anything (None: the admin token, which may), so that a page
    offers its change forms only to whom they would not refuse."""
    return role is None or Role(role) is not Role.ANALYST
