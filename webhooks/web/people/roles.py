"""What each role of an operator user may do on /ops, checked at one place: the console's
session check (webhooks/web/ops/auth.py `require_admin`), before every console page and the RQ
dashboard, so that no route checks a role of its own.

- `analyst`: reads; every change (any method but GET, HEAD, OPTIONS) is 403.
- `admin`: everything but the users (a change on /ops/users is 403).
- `owner`: everything.

The admin token (bearer, or a session opened with it) is no user: it may do everything, and
the audit log names it "admin". A user's changes are audited under its name (`act_as`)."""

from __future__ import annotations

from typing import Any

from flask import g

from webhooks.errors import Forbidden
from webhooks.storage.records import audit
from webhooks.storage.records.models import User
from webhooks.web.people import accounts

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
USERS_ENDPOINTS = "ops.users."  # the console's user pages (webhooks/web/people/pages.py)


def check(user: User, method: str, endpoint: str | None) -> None:
    """Pass when the user's role may make this request; else raise 403."""
    if method in SAFE_METHODS:
        return
    role = accounts.Role(user.role)
    if role is accounts.Role.ANALYST:
        raise Forbidden("an analyst reads and changes nothing", code="read_only_role")
    if role is not accounts.Role.OWNER and (endpoint or "").startswith(USERS_ENDPOINTS):
        raise Forbidden("only an owner manages users", code="owner_only")


def act_as(user: User) -> None:
    """Name the user in every audit row this request writes as "admin"."""
    g.audit_acting = audit.acting(accounts.actor(user))


def done(_exc: BaseException | None = None) -> None:
    """teardown_request: the request's user stops acting."""
    token: Any = g.pop("audit_acting", None)
    if token is not None:
        audit.reset(token)
