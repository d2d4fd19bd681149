"""Operator users (docs/api.md "Operator users"): invited by e-mail and role, set up once
through a link, checked at login. No Flask here: the views call these functions.

An invitation makes a row without a password and a one-time set-up token, shown once in the
link `/ops/setup/<token>`; only its SHA-256 is stored, with an expiry, and the first set-up
clears it, so a link works once. Passwords are hashed with argon2id (argon2-cffi's
PasswordHasher defaults, RFC 9106's low-memory choice). An owner or an admin has a TOTP secret
from the invitation on, shown on the set-up page and confirmed there by a current code; an
analyst has none. Deactivating keeps the row (the audit log names it) and ends every login
and session of the user."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from datetime import timedelta
from enum import StrEnum
from typing import Any

import pyotp
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from email_validator import EmailNotValidError, validate_email

from webhooks.errors import Conflict, NotFound, ValidationError
from webhooks.storage.records import audit
from webhooks.storage.records.db import db, is_mysql
from webhooks.storage.records.models import Buyer, Publisher, User, utcnow


class Role(StrEnum):
    OWNER = "owner"  # everything, users included
    ADMIN = "admin"  # everything but users
    ANALYST = "analyst"  # reads everything, changes nothing
    BUYER = "buyer"  # the buyer portal of its buyer_id, nothing else
    PUBLISHER = "publisher"  # the publisher portal of its publisher_id, nothing else


TOTP_ROLES = frozenset({Role.OWNER, Role.ADMIN})  # a second factor is required of these
OPERATOR_ROLES = frozenset({Role.OWNER, Role.ADMIN, Role.ANALYST})  # log in on /ops only
PORTAL_ROLES = frozenset({Role.BUYER, Role.PUBLISHER})  # log in on /portal only
TENANT_FIELD = {Role.BUYER: "buyer_id", Role.PUBLISHER: "publisher_id"}  # a portal user's tie
MIN_PASSWORD = 12
MAX_PASSWORD = 1024  # argon2 takes any length; a megabyte's hash is no login
SETUP_TTL = timedelta(hours=72)
ISSUER = "Floodgate"

_hasher = PasswordHasher()  # argon2id, RFC 9106 low-memory parameters
# Verified when no user has the e-mail, so that an unknown address takes as long as a known one.
_NOBODY = _hasher.hash(secrets.token_urlsafe(16))
HASHING_THREADS = 2  # argon2 calls at once per process: each takes 64 MiB and ~0.1 s of a core
_pool: Any = None


def _off_loop(fn: Any, *args: Any) -> Any:
    """`fn(*args)` for an argon2 call (about 0.1-0.2 s of CPU): in a web worker, on a pool of
    HASHING_THREADS threads (argon2's C code runs without the GIL), so the gevent loop goes on
    serving leads meanwhile and no more than that many hashes hold their memory at once; in
    any other process, here."""
    global _pool
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        return fn(*args)
    if _pool is None:
        from gevent.threadpool import ThreadPool

        _pool = ThreadPool(HASHING_THREADS)
    return _pool.apply(fn, args)


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def actor(user: User) -> str:
    """How the audit log names the user (webhooks/storage/records/audit.py)."""
    return f"user:{user.email}"


def _email(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValidationError("invalid_user", "email", "required: the user's e-mail address")
    text = raw.strip().lower()
    try:
        validate_email(text, check_deliverability=False)
    except EmailNotValidError as exc:
        raise ValidationError("invalid_user", "email", str(exc)) from None
    if len(text) > 254:
        raise ValidationError("invalid_user", "email", "at most 254 characters")
    return text


def _role(raw: Any) -> Role:
    try:
        return Role(raw)
    except ValueError:
        raise ValidationError("invalid_user", "role", "one of owner, admin, analyst, buyer, publisher") from None


def _tenant(role: Role, body: dict[str, Any]) -> str | None:
    """The buyer or publisher a portal user is tied to, which must exist (and not be deleted);
    None for an operator, who is tied to none. A 400 naming the field otherwise."""
    tie = TENANT_FIELD.get(role)
    for other in TENANT_FIELD.values():
        if other in body and other != tie:
            raise ValidationError("invalid_user", other, f"not a field of a user of role {role.value}")
    if tie is None:
        return None
    field = tie
    raw = body.get(field)
    if not isinstance(raw, str) or not raw:
        raise ValidationError("invalid_user", field, f"required for a user of role {role.value}")
    if role is Role.BUYER:
        found = Buyer.select().where(Buyer.id == raw, Buyer.deleted_at.is_null()).exists()
    else:
        found = Publisher.select().where(Publisher.id == raw).exists()
    if not found:
        raise ValidationError("invalid_user", field, f"no {role.value} {raw!r}")
    return raw


def parse_new(body: Any) -> tuple[str, Role, str | None]:
    """The e-mail, role and (a portal user) buyer or publisher id of `POST /v1/admin/users`, or
    a 400 naming the field."""
    if not isinstance(body, dict):
        raise ValidationError("invalid_user", "body", "a JSON object with email and role")
    unknown = sorted(set(body) - {"email", "role", *TENANT_FIELD.values()})
    if unknown:
        raise ValidationError("invalid_user", unknown[0], "not a field of a user")
    role = _role(body.get("role"))
    return _email(body.get("email")), role, _tenant(role, body)


def invite(email: str, role: Role, tenant: str | None = None) -> tuple[User, str]:
    """A new user and its set-up token (returned once, stored as its SHA-256); 409 when the
    e-mail is taken. `tenant`: a portal user's buyer or publisher id (parse_new checked it)."""
    token = secrets.token_urlsafe(32)
    now = utcnow()
    with db.atomic():
        if User.select().where(User.email == email).exists():
            raise Conflict(f"a user with the e-mail {email!r} exists", code="user_exists")
        user = User.create(
            email=email,
            role=role.value,
            totp_secret=pyotp.random_base32() if role in TOTP_ROLES else None,
            buyer_id=tenant if role is Role.BUYER else None,
            publisher_id=tenant if role is Role.PUBLISHER else None,
            setup_digest=digest(token),
            setup_expires_at=now + SETUP_TTL,
            created_at=now,
            updated_at=now,
        )
        detail = {"email": email, "role": role.value, **({TENANT_FIELD[role]: tenant} if tenant else {})}
        audit.record(audit.ADMIN, "user.invite", "user", str(user.id), detail)
    return user, token


def to_json(user: User) -> dict[str, Any]:
    """A user as the API shows it: never its hash, secret or set-up token."""
    return {
        "id": user.id,
        "email": user.email,
        "role": user.role,
        "active": bool(user.active),
        "set_up": user.password_hash is not None,
        "second_factor": user.totp_secret is not None,
        **({"buyer_id": user.buyer_id} if user.buyer_id else {}),
        **({"publisher_id": user.publisher_id} if user.publisher_id else {}),
        "created_at": user.created_at.isoformat() + "Z",
    }


def listed() -> list[User]:
    return list(User.select().order_by(User.id))


def existing(user_id: int) -> User:
    user = User.get_or_none(User.id == user_id)
    if user is None:
        raise NotFound(f"no user {user_id}")
    return user


def active(user_id: int) -> User | None:
    """The user when it exists, is active and has set up its password; else None."""
    return User.get_or_none((User.id == user_id) & (User.active == True) & User.password_hash.is_null(False))  # noqa: E712


def deactivate(user_id: int) -> User:
    """The user made inactive (its sessions end with it: every request looks it up), with an
    audit row; deactivating an inactive one changes nothing. The last owner who can log in
    (active and set up) stays (409 `last_owner`): without one, nobody could manage users but
    the admin token."""
    with db.atomic():
        user = existing(user_id)
        if user.active and user.password_hash is not None and Role(user.role) is Role.OWNER:
            owners = User.select(User.id).where(
                (User.role == Role.OWNER.value) & (User.active == True) & User.password_hash.is_null(False)  # noqa: E712
            )
            # the owners' rows locked: owners deactivated at once go one after another, and the
            # last finds its owner the last one
            if [u.id for u in (owners.for_update() if is_mysql() else owners)] == [user_id]:
                raise Conflict(
                    "the last active owner cannot be deactivated: make another owner first", code="last_owner"
                )
        if user.active:
            User.update(active=False, setup_digest=None, updated_at=utcnow()).where(User.id == user_id).execute()
            audit.record(audit.ADMIN, "user.deactivate", "user", str(user_id), {"email": user.email})
    return existing(user_id)


def awaiting_setup(token: str) -> User | None:
    """The user whose unexpired, unused set-up token `token` is; else None."""
    if not token or len(token) > 128:
        return None
    user = User.get_or_none((User.setup_digest == digest(token)) & (User.active == True))  # noqa: E712
    if user is None or user.setup_expires_at is None or user.setup_expires_at <= utcnow():
        return None
    return user


def otpauth_uri(user: User) -> str:
    return pyotp.TOTP(user.totp_secret or "").provisioning_uri(name=user.email, issuer_name=ISSUER)


def password_problem(password: str, again: str) -> str | None:
    """Why `password` cannot be set (too short, too long, not typed the same twice); None: it can."""
    if len(password) < MIN_PASSWORD:
        return f"The password must be at least {MIN_PASSWORD} characters long."
    if len(password) > MAX_PASSWORD:
        return f"The password must be at most {MAX_PASSWORD} characters long."
    if password != again:
        return "The two passwords differ."
    return None


def code_matches(user: User, code: str) -> int | None:
    """The TOTP time step `code` is right for (now, or one step either side for a clock a little
    off); None when it is wrong or the user has no secret."""
    if not user.totp_secret or not code.isdigit() or len(code) != 6:
        return None
    totp = pyotp.TOTP(user.totp_secret)
    step = int(time.time()) // totp.interval
    for candidate in (step, step - 1, step + 1):
        if hmac.compare_digest(totp.generate_otp(candidate), code):
            return candidate
    return None


def complete_setup(token: str, password: str) -> User | None:
    """Set the password of the user whose set-up token this is, using the token up: of two
    set-ups at once, one only. None when the token is unknown, used or expired."""
    user = awaiting_setup(token)
    if user is None:
        return None
    hashed = _off_loop(_hasher.hash, password)
    now = utcnow()
    with db.atomic():
        changed = (
            User.update(password_hash=hashed, setup_digest=None, setup_expires_at=None, updated_at=now)
            .where((User.id == user.id) & (User.setup_digest == digest(token)) & (User.setup_expires_at > now))
            .execute()
        )
        if changed != 1:
            return None
        audit.record(actor(user), "user.setup", "user", str(user.id), {"email": user.email})
    return existing(user.id)


def password_holder(email: str, password: str) -> User | None:
    """The active, set-up user with this e-mail and password; None otherwise (after as much
    work as a right e-mail takes). A hash made with older parameters is made again."""
    user = User.get_or_none((User.email == email.strip().lower()) & (User.active == True))  # noqa: E712
    stored = user.password_hash if user is not None else None
    try:
        _off_loop(_hasher.verify, stored or _NOBODY, password[:MAX_PASSWORD])
    except (VerificationError, InvalidHashError):
        return None
    if user is None or stored is None:
        return None
    if _hasher.check_needs_rehash(stored):
        User.update(password_hash=_off_loop(_hasher.hash, password)).where(User.id == user.id).execute()
    return user
