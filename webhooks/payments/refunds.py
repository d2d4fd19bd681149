"""Money going back: the one transaction per refund, refund failure or Stripe `charge.refunded`
(disputes.py uses the same frame), with the payment's row locked first, so each motion of one
payment's money is decided against what is already recorded, and each refund debited once in
whichever order its notifications come. docs/payments.md "Refunds and reversals" and "Money going
back"."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import peewee as pw

from webhooks.billing import wallets
from webhooks.errors import InvalidPayload, PaymentNotFound, ReferenceConflict, RefundExceedsPayment
from webhooks.events import outbox
from webhooks.payments.ledger import Receipt, balance, credit_wallet, write_call
from webhooks.payments.providers.motions import RefundNotification
from webhooks.payments.states import DisputeStatus, Ignored, Motion, PaymentStatus, RefundStatus, Verdict
from webhooks.storage.records import audit
from webhooks.storage.records.db import db, is_mysql, retried
from webhooks.storage.records.models import Payment, PaymentDispute, Refund, utcnow

log = logging.getLogger(__name__)

INCLUDES_FEE = "refund_includes_fee"
DISPUTE_REFUND = "dispute_refund"  # a Paystack refund that was its dispute's money, debited with the dispute


@dataclass(frozen=True)
class Outcome:
    """What a motion did: its verdict, and why when it moved nothing (`ignored`)."""

    verdict: Verdict
    reason: Ignored | None = None


class Refused(Exception):
    """Raised inside the transaction to roll it back; answered after the rollback."""

    def __init__(self, error: Exception, verdict: Verdict, status: int, flag: tuple[str, dict[str, Any]] | None = None):
        super().__init__(verdict)
        self.error, self.verdict, self.status, self.flag = error, verdict, status, flag


def writing() -> pw._atomic:
    """A transaction that writes from its first statement: SQLite's takes the write lock as it
    begins (db.py SQLite); MySQL locks the rows it reads (`locked_payment`)."""
    return db.atomic()


def locked_payment(note: RefundNotification) -> Payment:
    """The payment `note` concerns, its row locked; Refused (409 payment_not_found) when the
    ledger has none yet: the provider sends its webhook again later."""
    query = Payment.select().where(Payment.provider == note.provider, Payment.reference == note.payment_reference)
    if is_mysql():
        query = query.for_update()
    payment: Payment | None = query.first()
    if payment is None:
        raise Refused(
            PaymentNotFound(
                f"no {note.provider} payment {note.payment_reference!r} in the ledger "
                "yet; nothing moved, send it again later"
            ),
            Verdict.PAYMENT_NOT_FOUND,
            409,
        )
    return payment


def _payer(payment: Payment) -> str | None:
    """The payer's e-mail the payment's notification carried: `payer` ('' when it had none); a row
    from before attribution (payer NULL) was credited to that e-mail."""
    if payment.payer is None:
        return payment.customer
    return payment.payer or None


def check_same_payer(note: RefundNotification, payment: Payment) -> None:
    """A motion naming another currency or payer than its payment's is not that payment's
    (the payer is the e-mail the payment came with: its wallet may be the merchant's account)."""
    paid_by = _payer(payment)
    mismatch = {
        k: v
        for k, v, known in (("currency", note.currency, payment.currency), ("customer", note.customer, paid_by))
        if v is not None and known is not None and v != known
    }
    if mismatch:
        detail = {"payment": {"currency": payment.currency, "customer": paid_by}, "refund": mismatch}
        raise Refused(
            ReferenceConflict(
                f"{note.kind} {note.reference!r} names another currency or payer than payment "
                f"{note.payment_reference!r}; nothing moved, flagged for review"
            ),
            Verdict.REFERENCE_CONFLICT,
            422,
            (f"{note.kind}.reference_conflict", detail),
        )


def status_of(payment: Payment) -> PaymentStatus:
    """A credited payment's status from what went back (unattributed stays so until assigned)."""
    if payment.status == PaymentStatus.UNATTRIBUTED:
        return PaymentStatus.UNATTRIBUTED
    if payment.disputed_minor > 0:
        return PaymentStatus.DISPUTED
    if payment.refunded_minor >= payment.amount_minor:
        return PaymentStatus.REFUNDED
    return PaymentStatus.PARTIALLY_REFUNDED if payment.refunded_minor > 0 else PaymentStatus.CREDITED


def save(payment: Payment, **changes: int) -> None:
    """Write the payment's changed sums and the status they give."""
    for name, value in changes.items():
        setattr(payment, name, value)
    fields: dict[pw.Field, object] = {getattr(Payment, name): value for name, value in changes.items()}
    fields[Payment.status] = status_of(payment)
    Payment.update(fields).where(Payment.id == payment.id).execute()


_DISPUTES = (Motion.DISPUTE_WITHDRAWN, Motion.DISPUTE_REINSTATED)


def move_wallet(note: RefundNotification, payment: Payment, delta: int, now: datetime, reference: str) -> None:
    """Add `delta` (negative: a debit) to the payment's wallet, with its wallet event (the
    outbox) under `reference`. An unattributed payment's wallet is not known: nothing moves
    (its sums lower what an assign credits)."""
    if delta == 0 or payment.status == PaymentStatus.UNATTRIBUTED:
        return
    customer, currency = payment.customer, payment.currency
    entry = wallets.Entry.DISPUTE if note.kind in _DISPUTES else wallets.Entry.REFUND
    journal = f"{note.provider}:{reference}"
    if delta > 0:
        after = credit_wallet(customer, currency, delta, now, entry=entry, reference=journal)
        kind = outbox.EventType.WALLET_CREDITED
    else:
        wallets.add(customer, currency, delta, now)  # credited once, it exists; made should it not
        wallets.write(customer, currency, kind=entry, amount_minor=delta, reference=journal, at=now)
        after = balance(customer, currency)
        kind = outbox.EventType.WALLET_DEBITED
        if after < 0:
            key = f"{customer}:{currency}"
            detail = {"balance_minor": after, note.kind.value: f"{note.provider}:{note.reference}"}
            audit.record("payments", "wallet.negative_balance", "wallet", key, detail)
            log.warning("%s %s:%s takes a wallet below zero; flagged", note.kind, note.provider, note.reference)
    outbox.emit(
        outbox.wallet_event(
            kind=kind,
            provider=note.provider,
            reference=reference,
            customer=customer,
            currency=currency,
            amount_minor=abs(delta),
            balance_minor=after,
        ),
        now,
    )


def _exceeds(note: RefundNotification, payment: Payment, amount: int, detail: dict[str, Any]) -> Refused:
    return Refused(
        RefundExceedsPayment(
            f"{note.kind} {note.reference!r} of {amount} would take the refunds of payment "
            f"{note.payment_reference!r} past the whole transaction; nothing debited, flagged for review"
        ),
        Verdict.REFUND_EXCEEDS_PAYMENT,
        422,
        ("refund.exceeds_payment", {"payment_amount_minor": payment.amount_minor, **detail}),
    )


def _dispute_took(note: RefundNotification, amount: int) -> bool:
    """Paystack: a dispute resolved with a refund reaches the payer as a refund too (its refund
    list items name their `dispute`), while `refund.processed` names none. A refund of the amount
    a withdrawn dispute of this payment took, not yet matched with a refund, is that money."""
    if note.provider != "paystack":
        return False
    same = (PaymentDispute.provider == note.provider) & (PaymentDispute.payment_reference == note.payment_reference)
    taken = PaymentDispute.select().where(
        same, PaymentDispute.status == DisputeStatus.WITHDRAWN, PaymentDispute.amount_minor == amount
    )
    matched = Refund.select().where(
        Refund.provider == note.provider,
        Refund.payment_reference == note.payment_reference,
        Refund.flag == DISPUTE_REFUND,
        Refund.amount_minor == amount,
    )
    return bool(taken.count() > matched.count())


def _record(
    note: RefundNotification,
    payment: Payment,
    amount: int,
    d: Receipt,
    *,
    now: datetime,
    debited: int,
    flag: str | None,
) -> None:
    """The refund's row (the UNIQUE key is the final guard), flagged in audit_log when `flag`."""
    Refund.insert(
        provider=note.provider,
        reference=note.reference,
        payment_reference=note.payment_reference,
        amount_minor=amount,
        currency=payment.currency,
        customer=payment.customer,
        event_type=note.event_type,
        received_at=d.received_at,
        debited_at=now,
        status=RefundStatus.DEBITED,
        debited_minor=debited,
        flag=flag,
    ).execute()
    if flag is not None:
        detail = {"amount_minor": amount, "debited_minor": debited}
        audit.record("payments", f"refund.{flag}", "refund", f"{note.provider}:{note.reference}", detail)


def _refund(note: RefundNotification, payment: Payment, amount: int, d: Receipt, now: datetime) -> Outcome:
    """A refund id whose money went back: debit what charge.refunded (or a Paystack dispute's
    refund) has not already debited of it, up to what was credited; a refund that also returns
    the fee the payer paid on top (Paystack: `amount` past `requested_amount`) debits what was
    credited and is flagged."""
    if _dispute_took(note, amount):  # debited when its dispute resolved: the same money, once
        _record(note, payment, amount, d, now=now, debited=0, flag=DISPUTE_REFUND)
        return Outcome(Verdict.DUPLICATE)
    absorbed = min(amount, payment.refund_unnamed_minor)
    debit = amount - absorbed
    room = payment.amount_minor - payment.refunded_minor
    flag = None
    if debit > room:
        returned = Refund.select(pw.fn.COALESCE(pw.fn.SUM(Refund.amount_minor), 0)).where(
            Refund.provider == note.provider,
            Refund.payment_reference == note.payment_reference,
            Refund.status == RefundStatus.DEBITED,
            Refund.debited_minor.is_null(True) | (Refund.debited_minor != 0),  # 0: its dispute's money
        )
        if not payment.fees_minor or returned.scalar() + amount > payment.amount_minor + payment.fees_minor:
            raise _exceeds(note, payment, amount, {"refunded_minor": payment.refunded_minor, "amount_minor": amount})
        flag, debit = INCLUDES_FEE, room
    _record(note, payment, amount, d, now=now, debited=absorbed + debit, flag=flag)
    save(
        payment,
        refunded_minor=payment.refunded_minor + debit,
        refund_unnamed_minor=payment.refund_unnamed_minor - absorbed,
    )
    move_wallet(note, payment, -debit, now, note.reference)
    if debit == 0 and flag is None:  # charge.refunded took it already
        return Outcome(Verdict.DUPLICATE)
    return Outcome(Verdict.DEBITED)


def _reversal(note: RefundNotification, payment: Payment, amount: int, known: Refund | None, now: datetime) -> Outcome:
    """A refund that failed or was canceled: what it took comes back, once. One never debited by
    its id may have been by charge.refunded (the unnamed part)."""
    if known is not None:
        if known.status == RefundStatus.REVERSED:
            return Outcome(Verdict.DUPLICATE)
        back = known.amount_minor if known.debited_minor is None else known.debited_minor
        Refund.update(status=RefundStatus.REVERSED, reversed_at=now).where(Refund.id == known.id).execute()
        save(payment, refunded_minor=payment.refunded_minor - back)
    else:
        back = min(amount, payment.refund_unnamed_minor)
        Refund.insert(
            provider=note.provider,
            reference=note.reference,
            payment_reference=note.payment_reference,
            amount_minor=amount,
            currency=payment.currency,
            customer=payment.customer,
            event_type=note.event_type,
            received_at=now,
            debited_at=now,
            status=RefundStatus.REVERSED,
            debited_minor=back,  # what charge.refunded had debited of it, now given back
            reversed_at=now,
        ).execute()
        save(
            payment,
            refunded_minor=payment.refunded_minor - back,
            refund_unnamed_minor=payment.refund_unnamed_minor - back,
        )
    move_wallet(note, payment, back, now, note.reference)
    return Outcome(Verdict.CREDITED) if back else Outcome(Verdict.IGNORED, Ignored.NOT_DEBITED)


def _charge_refunded(note: RefundNotification, payment: Payment, total: int, now: datetime) -> Outcome:
    """Stripe's cumulative `amount_refunded`: debit what it adds over what is recorded (refunds
    debited, and refunds that failed after they were counted: see docs/payments.md)."""
    if total > payment.amount_minor:
        raise _exceeds(note, payment, total, {"amount_refunded_minor": total})
    # A refund that failed after the charge counted it: an older charge.refunded (a retry, or
    # one that came late) still includes it, so what was given back is counted as refunded.
    reversed_ = Refund.select(pw.fn.COALESCE(pw.fn.SUM(Refund.debited_minor), 0)).where(
        Refund.provider == note.provider,
        Refund.payment_reference == note.payment_reference,
        Refund.status == RefundStatus.REVERSED,
    )
    debit = total - payment.refunded_minor - int(reversed_.scalar())
    if debit <= 0:
        return Outcome(Verdict.DUPLICATE)
    save(
        payment,
        refunded_minor=payment.refunded_minor + debit,
        refund_unnamed_minor=payment.refund_unnamed_minor + debit,
    )
    move_wallet(note, payment, -debit, now, f"{note.reference}:refunded:{total}")
    return Outcome(Verdict.DEBITED)


def _once(note: RefundNotification, d: Receipt) -> Outcome:
    with writing():
        now = utcnow()
        payment = locked_payment(note)
        amount = note.amount_minor(payment.currency)
        check_same_payer(note, payment)
        if note.kind is Motion.CHARGE_REFUNDED:
            outcome = _charge_refunded(note, payment, amount, now)
        else:
            known = Refund.get_or_none(Refund.provider == note.provider, Refund.reference == note.reference)
            if known is not None and (known.payment_reference, known.amount_minor) != (note.payment_reference, amount):
                raise pw.IntegrityError("refund reference known with another payment or amount")
            if note.kind is Motion.REFUND_REVERSED:
                outcome = _reversal(note, payment, amount, known, now)
            elif known is not None:
                outcome = Outcome(Verdict.DUPLICATE)
            else:
                outcome = _refund(note, payment, amount, d, now)
        write_call(d, outcome.verdict, 200, note, reason=outcome.reason)
    return outcome


def run_motion(note: RefundNotification, d: Receipt, transaction: Callable[[], Outcome]) -> Outcome:
    """Run a motion's transaction (deadlocks retried); a refusal is recorded (and flagged) after
    its rollback and raised as its error. Shared with disputes.py."""
    try:
        return retried(transaction, f"{note.kind} {note.provider}:{note.reference}")
    except InvalidPayload as exc:  # an amount that is no whole number of the payment's minor units
        write_call(d, exc.code, 400, note)
        raise
    except Refused as refused:
        with db.atomic():
            if refused.flag is not None:
                action, detail = refused.flag
                audit.record("payments", action, note.kind.value, f"{note.provider}:{note.reference}", detail)
            write_call(d, refused.verdict, refused.status, note)
        if refused.flag is not None:  # references only: amounts and payers are in audit_log
            log.warning(
                "%s %s:%s of payment %s refused (%s), flagged in audit_log",
                note.kind,
                note.provider,
                note.reference,
                note.payment_reference,
                refused.verdict,
            )
        raise refused.error from None


def apply(note: RefundNotification, d: Receipt) -> Outcome:
    """A refund, a refund's failure or Stripe's `charge.refunded`, once: DEBITED / CREDITED, or
    DUPLICATE when it is already in the ledger (or moved nothing new). Raises PaymentNotFound
    (409: the payment is not in the ledger yet), RefundExceedsPayment (422, flagged),
    ReferenceConflict (422, flagged: the refund id is known with another payment or amount, or
    the payment has another currency or payer) or InvalidPayload; in each case nothing moves and
    the webhook is recorded."""
    try:
        return run_motion(note, d, lambda: _once(note, d))
    except pw.IntegrityError as exc:
        return _conflict(note, d, exc)


def _conflict(note: RefundNotification, d: Receipt, exc: pw.IntegrityError) -> Outcome:
    known = Refund.get_or_none(Refund.provider == note.provider, Refund.reference == note.reference)
    if known is None:
        raise exc  # not the (provider, reference) key: a real fault, not a repeat
    if (known.payment_reference, known.amount_minor) == (note.payment_reference, note.amount_minor(known.currency)):
        write_call(d, Verdict.DUPLICATE, 200, note)  # a concurrent first webhook call for another payment row
        return Outcome(Verdict.DUPLICATE)
    detail = {
        "known": {"payment_reference": known.payment_reference, "amount_minor": known.amount_minor},
        "delivered": {"payment_reference": note.payment_reference, "amount": str(note.amount)},
    }
    with db.atomic():
        audit.record("payments", "refund.reference_conflict", "refund", f"{note.provider}:{note.reference}", detail)
        write_call(d, Verdict.REFERENCE_CONFLICT, 422, note)
    log.warning("refund reference conflict %s:%s: nothing moved, flagged in audit_log", note.provider, note.reference)
    raise ReferenceConflict(
        f"refund {note.reference!r} is already recorded for another payment or amount; "
        "nothing moved, flagged for review"
    )
