"""Refunds and reversals (API.md "Refunds and reversals"): the one transaction that debits a refund.

The same guards as a credit (ledger.py): the UNIQUE key (provider, reference) of `refunds`, not
the Redis claim, makes a refund debit its wallet at most once. The refunded payment's row is
locked for the transaction (`SELECT ... FOR UPDATE`; SQLite: `BEGIN IMMEDIATE`), so concurrent
refunds of one payment are checked one after the other against what is already refunded: their
sum never passes the payment's amount.
"""

from __future__ import annotations

import logging
from datetime import datetime

import peewee as pw

from webhooks.errors import InvalidPayload, PaymentNotFound, ReferenceConflict, RefundExceedsPayment
from webhooks.events import outbox
from webhooks.payments.events import RefundEvent
from webhooks.payments.ledger import Receipt, balance, record, retrying_deadlocks
from webhooks.payments.states import PaymentStatus, Verdict
from webhooks.storage import audit
from webhooks.storage.db import db, is_mysql
from webhooks.storage.models import Payment, Refund, Wallet, utcnow

log = logging.getLogger(__name__)


class _Refused(Exception):
    """Raised inside the debit transaction to roll it back; answered after the rollback."""

    def __init__(self, error: Exception, verdict: Verdict, status: int, flag: tuple[str, dict] | None = None):
        super().__init__(verdict)
        self.error, self.verdict, self.status, self.flag = error, verdict, status, flag


def _writing() -> pw._atomic:
    """A transaction that writes from its first statement: SQLite's BEGIN IMMEDIATE takes the
    write lock up front (a deferred one reading first could not write later); MySQL locks rows."""
    return db.atomic() if is_mysql() else db.atomic("IMMEDIATE")


def _locked_payment(event: RefundEvent) -> Payment | None:
    query = Payment.select().where(Payment.provider == event.provider, Payment.reference == event.payment_reference)
    if is_mysql():
        query = query.for_update()
    return query.first()


def _payer(payment: Payment) -> str | None:
    """The payer's e-mail the payment was delivered with: `payer` ('' when it had none); a row
    from before attribution (payer NULL) was credited to that e-mail."""
    if payment.payer is None:
        return payment.customer
    return payment.payer or None


def _check_same_payer(event: RefundEvent, payment: Payment) -> None:
    """A refund naming another currency or payer than its payment's is not that payment's
    (the payer is the e-mail the payment came with: its wallet may be the merchant's account)."""
    paid_by = _payer(payment)
    mismatch = {
        k: v
        for k, v, known in (("currency", event.currency, payment.currency), ("customer", event.customer, paid_by))
        if v is not None and known is not None and v != known
    }
    if mismatch:
        detail = {"payment": {"currency": payment.currency, "customer": paid_by}, "refund": mismatch}
        raise _Refused(
            ReferenceConflict(
                f"refund {event.reference!r} names another currency or payer than payment "
                f"{event.payment_reference!r}; nothing debited, flagged for review"
            ),
            Verdict.REFERENCE_CONFLICT,
            422,
            ("refund.reference_conflict", detail),
        )


def _debit_wallet(customer: str, currency: str, amount: int, now: datetime) -> int:
    """Take `amount` from the wallet (below zero if need be: the provider already returned the
    money) and return the balance after it."""
    changed = (
        Wallet.update(balance_minor=Wallet.balance_minor - amount, updated_at=now)
        .where(Wallet.customer == customer, Wallet.currency == currency)
        .execute()
    )
    if not changed:  # credited once, so it exists; kept correct should it not
        Wallet.insert(customer=customer, currency=currency, balance_minor=-amount, updated_at=now).execute()
    return balance(customer, currency)


def _debit_once(event: RefundEvent, d: Receipt) -> Verdict:
    with _writing():
        now = utcnow()
        payment = _locked_payment(event)
        if payment is None:
            raise _Refused(
                PaymentNotFound(
                    f"no {event.provider} payment {event.payment_reference!r} in the ledger "
                    "yet; nothing debited, deliver the refund again later"
                ),
                Verdict.PAYMENT_NOT_FOUND,
                409,
            )
        amount = event.amount_minor(payment.currency)
        _check_same_payer(event, payment)
        Refund.insert(
            provider=event.provider,
            reference=event.reference,
            payment_reference=event.payment_reference,
            amount_minor=amount,
            currency=payment.currency,
            customer=payment.customer,
            event_type=event.event_type,
            received_at=d.received_at,
            debited_at=now,
        ).execute()
        refunded = payment.refunded_minor + amount
        if refunded > payment.amount_minor:
            detail = {
                "payment_amount_minor": payment.amount_minor,
                "refunded_minor": payment.refunded_minor,
                "refund": {"reference": event.reference, "amount_minor": amount},
            }
            raise _Refused(
                RefundExceedsPayment(
                    f"refund {event.reference!r} of {amount} would take the refunds of payment "
                    f"{event.payment_reference!r} to {refunded}, past its {payment.amount_minor}; nothing debited, "
                    "flagged for review"
                ),
                Verdict.REFUND_EXCEEDS_PAYMENT,
                422,
                ("refund.exceeds_payment", detail),
            )
        if payment.status == PaymentStatus.UNATTRIBUTED:
            # No wallet was credited: the refund is recorded and lowers what an assign credits.
            Payment.update(refunded_minor=refunded).where(Payment.id == payment.id).execute()
            record(d, Verdict.DEBITED, 200, event)
            return Verdict.DEBITED
        (
            Payment.update(
                refunded_minor=refunded,
                status=PaymentStatus.REFUNDED if refunded == payment.amount_minor else PaymentStatus.PARTIALLY_REFUNDED,
            )
            .where(Payment.id == payment.id)
            .execute()
        )
        after = _debit_wallet(payment.customer, payment.currency, amount, now)
        if after < 0:
            audit.record(
                "payments",
                "wallet.negative_balance",
                "wallet",
                f"{payment.customer}:{payment.currency}",
                {"balance_minor": after, "refund": f"{event.provider}:{event.reference}"},
            )
            log.warning(
                "refund %s:%s takes a wallet below zero (%s %s); flagged in audit_log",
                event.provider,
                event.reference,
                after,
                payment.currency,
            )
        debited = outbox.EventType.WALLET_DEBITED
        outbox.record(
            outbox.wallet_event(
                debited, event.provider, event.reference, payment.customer, payment.currency, amount, after
            ),
            now,
        )
        record(d, Verdict.DEBITED, 200, event)
    return Verdict.DEBITED


def debit(event: RefundEvent, d: Receipt) -> Verdict:
    """Debit a refund once: DEBITED, or DUPLICATE when this refund reference is already in
    the ledger with the same payment and amount. Raises PaymentNotFound (409: the payment is not
    in the ledger yet), RefundExceedsPayment (422, flagged), ReferenceConflict (422, flagged: the
    reference is known with another payment or amount, or the payment has another currency or
    payer) or InvalidPayload; in each case nothing is debited and the webhook is recorded."""
    try:
        return retrying_deadlocks(lambda: _debit_once(event, d), f"debiting {event.provider}:{event.reference}")
    except pw.IntegrityError as exc:
        return _already_known(event, d, exc)
    except InvalidPayload as exc:  # an amount that is no whole number of the payment's minor units
        record(d, exc.code, 400, event)
        raise
    except _Refused as refused:
        with db.atomic():
            if refused.flag is not None:
                action, detail = refused.flag
                audit.record("payments", action, "refund", f"{event.provider}:{event.reference}", detail)
            record(d, refused.verdict, refused.status, event)
        if refused.flag is not None:  # references only: amounts and payers are in audit_log
            log.warning(
                "refund %s:%s of payment %s refused (%s), flagged in audit_log",
                event.provider,
                event.reference,
                event.payment_reference,
                refused.verdict,
            )
        raise refused.error from None


def _already_known(event: RefundEvent, d: Receipt, exc: pw.IntegrityError) -> Verdict:
    known = Refund.get_or_none(Refund.provider == event.provider, Refund.reference == event.reference)
    if known is None:
        raise exc  # not the (provider, reference) key: a real fault, not a repeat
    if (known.payment_reference, known.amount_minor) == (event.payment_reference, event.amount_minor(known.currency)):
        record(d, Verdict.DUPLICATE, 200, event)
        return Verdict.DUPLICATE
    detail = {
        "known": {"payment_reference": known.payment_reference, "amount_minor": known.amount_minor},
        "delivered": {"payment_reference": event.payment_reference, "amount": str(event.amount)},
    }
    with db.atomic():
        audit.record("payments", "refund.reference_conflict", "refund", f"{event.provider}:{event.reference}", detail)
        record(d, Verdict.REFERENCE_CONFLICT, 422, event)
    log.warning(
        "refund reference conflict %s:%s: nothing debited, flagged in audit_log", event.provider, event.reference
    )
    raise ReferenceConflict(
        f"refund {event.reference!r} was already debited for another payment or amount; "
        "nothing debited, flagged for review"
    )
