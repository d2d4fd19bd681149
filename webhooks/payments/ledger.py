"""The payment ledger: the one transaction that credits a payment, the audit trail of every
verified webhook, and the reads the admin API shows. (The Redis front that short-cuts repeats
is gate.py; refunds, which debit, are in refunds.py; the events both announce go to the outbox,
webhooks/events/outbox.py; a webhook that fails its signature check never reaches the
database, see rejected.py; the steps in order, webhook.py.)

The UNIQUE key (provider, reference) of `payments`, not the Redis claim, is what makes a credit
happen at most once: a second insert of the same reference fails inside its transaction, which
then credits nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import peewee as pw

from webhooks.billing import wallets
from webhooks.errors import AlreadyAssigned, NotFound, ReferenceConflict
from webhooks.events import outbox
from webhooks.payments.providers.notifications import PaymentNotification, RefundNotification
from webhooks.payments.providers.signatures import HEADERS, SECRET_HEADERS
from webhooks.payments.states import PaymentStatus, Source, Verdict
from webhooks.storage.records import audit, fastsql
from webhooks.storage.records.db import db, is_mysql, retried
from webhooks.storage.records.models import Payment, Wallet, WebhookCall, utcnow

log = logging.getLogger(__name__)

BODY_CAP = 64 * 1024  # bytes of each webhook's body kept for audit and replay
_KEPT_HEADERS = ("content-type", "user-agent")


@dataclass(frozen=True, kw_only=True)
class Receipt:
    """What is kept of one incoming webhook, as it arrived: headers of interest (JSON), capped
    body, arrival, and the length and SHA-256 of the whole body."""

    provider: str
    headers: str
    body: bytes
    truncated: bool
    received_at: datetime
    length: int
    sha256: str


def receipt(provider: str, raw: bytes, headers: Mapping[str, str]) -> Receipt:
    """Capture a webhook as it arrived; `headers` is case-insensitive (Flask's request.headers)."""
    kept = {}
    for name in HEADERS[provider] + _KEPT_HEADERS:
        value = headers.get(name)
        if value is not None:
            kept[name] = "<redacted>" if name in SECRET_HEADERS else value[:1024]
    return Receipt(
        provider=provider,
        headers=json.dumps(kept, sort_keys=True),
        body=raw[:BODY_CAP],
        truncated=len(raw) > BODY_CAP,
        received_at=utcnow(),
        length=len(raw),
        sha256=hashlib.sha256(raw).hexdigest(),
    )


def receipt_fields(d: Receipt, note: PaymentNotification | RefundNotification | None = None) -> dict[str, Any]:
    """The webhook_calls columns of a verified webhook, but its verdict and status."""
    return {
        "provider": d.provider,
        "reference": note.reference if note else None,
        "event_type": note.event_type if note else None,
        "headers": d.headers,
        "body": d.body,
        "body_truncated": d.truncated,
        "received_at": d.received_at,
        "body_length": d.length,
        "body_sha256": d.sha256,
    }


def write_call(
    d: Receipt,
    verdict: str,
    status: int,
    note: PaymentNotification | RefundNotification | None = None,
    *,
    deferred: bool = False,
    reason: str | None = None,
) -> None:
    """Add the verified webhook to webhook_calls (in the caller's transaction, if any;
    `deferred`: see fastsql.insert); `reason`: why an ignored one moved nothing."""
    row = {**receipt_fields(d, note), "verdict": verdict, "status_code": status}
    if reason is not None:
        row["reason"] = reason
    fastsql.insert(WebhookCall, row, deferred)


def record_unconfirmed(d: Receipt, note: PaymentNotification, reason: str) -> None:
    """A verified webhook the provider's API does not confirm: kept, and flagged for review."""
    with db.atomic():
        audit.record(
            "payments",
            "payment.verification_failed",
            "payment",
            f"{note.provider}:{note.reference}",
            {"reason": reason},
        )
        write_call(d, Verdict.VERIFICATION_FAILED, 422, note)


# MySQL/MariaDB: the upsert hands the new balance back in the OK packet (LAST_INSERT_ID(expr)
# sets the connection's last insert id to expr), saving the SELECT of the wallet after it. The
# id is an unsigned integer: the balance travels shifted by _SHIFT (2^62), so a wallet refunds
# took below zero reads right too (balances are far inside ±2^62).
_SHIFT = 1 << 62
_UPSERT_RETURNING_BALANCE = (
    "INSERT INTO wallets (customer, currency, balance_minor, updated_at, version) VALUES (%s, %s, %s, %s, 1) "
    "ON DUPLICATE KEY UPDATE balance_minor = "
    f"CAST(LAST_INSERT_ID(balance_minor + VALUES(balance_minor) + {_SHIFT}) AS SIGNED) - {_SHIFT}, "
    "updated_at = VALUES(updated_at), version = version + 1"
)
# The wallet's balance after that upsert, as the statement right after it reads it (the upsert
# must be the statement just before): the amount when it made the wallet (ROW_COUNT() 1), else
# the shifted balance it left in LAST_INSERT_ID() (2: its version moved, whatever the amount).
_BALANCE_AFTER_UPSERT = f"IF(ROW_COUNT() = 1, %s, CAST(LAST_INSERT_ID() AS SIGNED) - {_SHIFT})"


def top_up(provider: str, reference: str, customer: str, *, currency: str, amount_minor: int, now: datetime) -> None:
    """Credit a payment's amount to a wallet (made at that amount if new), with its journal row
    (a top-up) and its `wallet.credited` event carrying the balance after, in the caller's
    transaction. On MySQL nothing of it needs an answer before the COMMIT: the statements are
    deferred (the upsert's balance, handed back, is not read) and the event's INSERT, right
    after the upsert, computes the balance from what it left (outbox.emit_with_balance), so the
    transaction is one round trip."""

    def event(balance_minor: int) -> outbox.NewEvent:
        return outbox.wallet_event(
            kind=outbox.EventType.WALLET_CREDITED,
            provider=provider,
            reference=reference,
            customer=customer,
            currency=currency,
            amount_minor=amount_minor,
            balance_minor=balance_minor,
        )

    key, kind = f"{provider}:{reference}", wallets.Entry.TOP_UP
    if is_mysql():
        wallets.write(customer, currency, kind=kind, amount_minor=amount_minor, reference=key, at=now, deferred=True)
        db.obj.defer(_UPSERT_RETURNING_BALANCE, (customer, currency, amount_minor, now))
        outbox.emit_with_balance(event(0), now, _BALANCE_AFTER_UPSERT, (amount_minor,))
        return
    after = credit_wallet(customer, currency, amount_minor, now, entry=kind, reference=key)
    outbox.emit(event(after), now, deferred=True)


def credit_wallet(
    customer: str, currency: str, amount_minor: int, now: datetime, *, entry: wallets.Entry, reference: str
) -> int:
    """Add a positive amount to a wallet (made at that amount if new), with its journal row;
    its balance after, read under the row lock the upsert takes."""
    wallets.write(customer, currency, kind=entry, amount_minor=amount_minor, reference=reference, at=now, deferred=True)
    if is_mysql():
        cursor = db.execute_sql(_UPSERT_RETURNING_BALANCE, (customer, currency, amount_minor, now))
        if cursor.rowcount == 1:  # inserted: the id is the new row's, the balance the amount
            return amount_minor
        return int(cursor.lastrowid) - _SHIFT  # updated (2): the balance after, shifted
    update = {
        Wallet.balance_minor: Wallet.balance_minor + amount_minor,
        Wallet.updated_at: now,
        Wallet.version: Wallet.version + 1,
    }
    query = Wallet.insert(customer=customer, currency=currency, balance_minor=amount_minor, updated_at=now, version=1)
    query.on_conflict(conflict_target=[Wallet.customer, Wallet.currency], update=update).execute()
    return balance(customer, currency)


def balance(customer: str, currency: str) -> int:
    """One wallet's balance, read inside the caller's transaction (which holds its row lock)."""
    query = Wallet.select(Wallet.balance_minor).where(Wallet.customer == customer, Wallet.currency == currency)
    return cast(int, query.scalar())


def credit(note: PaymentNotification, d: Receipt, source: Source = Source.WEBHOOK) -> Verdict:
    """Insert the payment, credit its wallet, write its `wallet.credited` event (the outbox)
    and record the webhook, in one transaction. A
    payment naming no wallet (customer None) is inserted `unattributed` and credits nothing
    until an `assign`; a flagged one (a partial or over payment) is credited and flagged in
    audit_log. `source` says whether a webhook or the provider reconciliation found it.

    Returns CREDITED (UNATTRIBUTED), or DUPLICATE when the reference is already in the ledger
    with the same amount, currency and payer; raises ReferenceConflict when it is there with
    others. A transaction refused whole (an InnoDB deadlock of concurrent upserts of one wallet, a
    Galera certification conflict, a connection lost before the COMMIT) is run again: `retried`."""
    attributed = note.customer is not None

    # On MySQL one round trip: the payment's INSERT, the wallet's journal row and upsert, the
    # outbox event (which reads the balance itself) and the webhook call's row travel with the COMMIT.
    def transaction() -> Verdict:
        with db.atomic():
            now = utcnow()
            fastsql.insert(
                Payment,
                {
                    "provider": note.provider,
                    "reference": note.reference,
                    "amount_minor": note.amount_minor,
                    "currency": note.currency,
                    "customer": note.customer or "",
                    "status": PaymentStatus.CREDITED if attributed else PaymentStatus.UNATTRIBUTED,
                    "event_type": note.event_type,
                    "received_at": d.received_at,
                    "credited_at": now if attributed else None,
                    "payer": note.payer or "",
                    "fees_minor": note.fees_minor,
                    "flag": note.flag,
                    "source": source,
                },
                deferred=True,
            )
            # a succeeded payment: parse() refused it without any of these
            assert note.reference and note.currency and note.amount_minor is not None
            key = f"{note.provider}:{note.reference}"
            if note.flag is not None:
                audit.record("payments", f"payment.{note.flag}", "payment", key, {"amount_minor": note.amount_minor})
            if not attributed:
                audit.record("payments", "payment.unattributed", "payment", key, {"amount_minor": note.amount_minor})
                write_call(d, Verdict.UNATTRIBUTED, 200, note)
                return Verdict.UNATTRIBUTED
            assert note.customer is not None
            top_up(
                note.provider,
                note.reference,
                note.customer,
                currency=note.currency,
                amount_minor=note.amount_minor,
                now=now,
            )
            write_call(d, Verdict.CREDITED, 200, note, deferred=True)
        return Verdict.CREDITED

    try:
        return retried(transaction, f"crediting {note.provider}:{note.reference}")
    except pw.IntegrityError as exc:
        return _already_known(note, d, exc)


def _same_payment(known: Payment, note: PaymentNotification) -> bool:
    """Whether a repeat agrees with the ledger: same amount and currency, and the same wallet,
    or no wallet named where the payment was unattributed or assigned one since."""
    if (known.amount_minor, known.currency) != (note.amount_minor, note.currency):
        return False
    if note.customer is None:
        return known.status == PaymentStatus.UNATTRIBUTED or known.assigned_at is not None
    return bool(known.customer == note.customer)


def _already_known(note: PaymentNotification, d: Receipt, exc: pw.IntegrityError) -> Verdict:
    known = Payment.get_or_none(Payment.provider == note.provider, Payment.reference == note.reference)
    if known is None:
        raise exc  # not the (provider, reference) key: a real fault, not a repeat
    if _same_payment(known, note):
        write_call(d, Verdict.DUPLICATE, 200, note)
        return Verdict.DUPLICATE
    detail = {
        "known": {"amount_minor": known.amount_minor, "currency": known.currency, "customer": known.customer},
        "delivered": {"amount_minor": note.amount_minor, "currency": note.currency, "customer": note.customer},
    }
    with db.atomic():
        audit.record("payments", "payment.reference_conflict", "payment", f"{note.provider}:{note.reference}", detail)
        write_call(d, Verdict.REFERENCE_CONFLICT, 422, note)
    # The reference only: the amounts and payer e-mails are in audit_log, not in log files.
    log.warning("reference conflict %s:%s: nothing credited, flagged in audit_log", note.provider, note.reference)
    raise ReferenceConflict(
        f"reference {note.reference!r} was already credited with another "
        "amount, currency or payer; nothing credited, flagged for review"
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat() + "Z"


def payment_record(p: Payment) -> dict[str, Any]:
    return {
        "provider": p.provider,
        "reference": p.reference,
        "amount_minor": p.amount_minor,
        "fees_minor": p.fees_minor,
        "currency": p.currency,
        "customer": p.customer or None,
        "status": p.status,
        "flag": p.flag,
        "source": p.source,
        "event_type": p.event_type,
        "received_at": _iso(p.received_at),
        "credited_at": _iso(p.credited_at),
        "assigned_at": _iso(p.assigned_at),
        "refunded_minor": p.refunded_minor,
        "disputed_minor": p.disputed_minor,
    }


def assign(provider: str, reference: str, customer: str) -> Payment:
    """Credit an unattributed payment to `customer`, exactly once: the conditional update
    (WHERE status = 'unattributed') decides which of concurrent assigns wins; the others raise
    AlreadyAssigned (409). NotFound (404) when there is no such payment. The wallet is credited
    what is left after refunds that came meanwhile, with its outbox event, in the same
    transaction."""

    def transaction() -> Payment:
        with db.atomic():
            now = utcnow()
            won = (
                Payment.update(customer=customer, status=PaymentStatus.CREDITED, credited_at=now, assigned_at=now)
                .where(
                    Payment.provider == provider,
                    Payment.reference == reference,
                    Payment.status == PaymentStatus.UNATTRIBUTED,
                )
                .execute()
            )
            payment = Payment.get_or_none(Payment.provider == provider, Payment.reference == reference)
            if payment is None:
                raise NotFound(f"no {provider} payment {reference!r}")
            if not won:
                raise AlreadyAssigned(f"{provider} payment {reference!r} is not unattributed (status {payment.status})")
            amount = payment.amount_minor - payment.refunded_minor - payment.disputed_minor
            if payment.refunded_minor or payment.disputed_minor:
                if payment.disputed_minor:
                    status = PaymentStatus.DISPUTED
                else:
                    status = PaymentStatus.REFUNDED if amount <= 0 else PaymentStatus.PARTIALLY_REFUNDED
                Payment.update(status=status).where(Payment.id == payment.id).execute()
                payment.status = status
            if amount > 0:
                top_up(provider, reference, customer, currency=payment.currency, amount_minor=amount, now=now)
            audit.record("admin", "payment.assign", "payment", f"{provider}:{reference}", {"customer": customer})
            return payment

    return retried(transaction, f"assigning {provider}:{reference}")


def unattributed(limit: int) -> list[Payment]:
    """The payments waiting for an assign, oldest first."""
    query = (
        Payment.select()
        .where(Payment.status == PaymentStatus.UNATTRIBUTED)
        .order_by(Payment.received_at, Payment.id)
        .limit(limit)
    )
    return list(query)


def balances(customer: str) -> dict[str, int]:
    """Balance per currency of one payer e-mail (empty when never credited)."""
    rows = (
        Wallet.select(Wallet.currency, Wallet.balance_minor)
        .where(Wallet.customer == customer)
        .order_by(Wallet.currency)
        .tuples()
    )
    return dict(cast("list[tuple[str, int]]", rows))  # peewee's stubs: .tuples() yields models


def ignored_counts(provider: str | None, since: datetime) -> list[dict[str, Any]]:
    """The verified webhook calls answered `ignored` since `since`, counted per provider, event type
    and reason, most frequent first: a money-moving type Floodgate does not know shows here."""
    n = pw.fn.COUNT(WebhookCall.id)
    query = (
        WebhookCall.select(
            WebhookCall.provider,
            WebhookCall.event_type,
            WebhookCall.reason,
            n.alias("count"),
            pw.fn.MAX(WebhookCall.received_at).alias("last"),
        )
        .where(WebhookCall.verdict == Verdict.IGNORED, WebhookCall.received_at >= since)
        .group_by(WebhookCall.provider, WebhookCall.event_type, WebhookCall.reason)
        .order_by(n.desc(), WebhookCall.provider, WebhookCall.event_type)
    )
    if provider is not None:
        query = query.where(WebhookCall.provider == provider)
    rows = cast("list[dict[str, Any]]", list(query.dicts()))  # peewee's stubs: .dicts() yields models
    return [
        {
            "provider": r["provider"],
            "event_type": r["event_type"],
            "reason": r["reason"],
            "count": r["count"],
            "last_received_at": _iso(r["last"] if isinstance(r["last"], datetime) else _parsed(r["last"])),
        }
        for r in rows
    ]


def _parsed(value: object) -> datetime | None:
    """SQLite hands an aggregate's datetime back as text."""
    return datetime.fromisoformat(value) if isinstance(value, str) else None
