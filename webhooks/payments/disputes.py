"""Disputes (chargebacks): a row per provider dispute id (`payment_disputes`), moving the wallet
once when the provider withdraws the money and once when it reinstates it, in the transaction
that records it, with its wallet event; the payment's row is locked first, as for refunds.
docs/payments.md "Money going back"."""

from __future__ import annotations

import peewee as pw

from webhooks.errors import ReferenceConflict
from webhooks.payments.ledger import Receipt, write_call
from webhooks.payments.providers.motions import RefundNotification
from webhooks.payments.refunds import (
    DISPUTE_REFUND,
    Outcome,
    check_same_payer,
    locked_payment,
    move_wallet,
    run_motion,
    save,
    writing,
)
from webhooks.payments.states import DisputeStatus, Ignored, Motion, RefundStatus, Verdict
from webhooks.storage.records import audit
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Payment, PaymentDispute, Refund, utcnow


def _refunded_already(note: RefundNotification, amount: int) -> bool:
    """Paystack: a dispute resolved with a refund reaches the payer as a refund too, and its
    `refund.processed` may come first, naming no dispute. A refund of this payment of the same
    amount not yet matched with a dispute is that money: it is matched now (flagged
    dispute_refund) and the dispute debits nothing (docs/payments.md "Money going back")."""
    if note.provider != "paystack":
        return False
    refund = (
        Refund.select()
        .where(
            Refund.provider == note.provider,
            Refund.payment_reference == note.payment_reference,
            Refund.status == RefundStatus.DEBITED,
            Refund.flag.is_null(True),
            Refund.amount_minor == amount,
        )
        .order_by(Refund.id)
        .first()
    )
    if refund is None:
        return False
    Refund.update(flag=DISPUTE_REFUND).where(Refund.id == refund.id).execute()
    detail = {"dispute": note.reference, "amount_minor": amount}
    audit.record("payments", f"refund.{DISPUTE_REFUND}", "refund", f"{note.provider}:{refund.reference}", detail)
    return True


def _once(note: RefundNotification, d: Receipt) -> Outcome:
    withdraw = note.kind is Motion.DISPUTE_WITHDRAWN
    with writing():
        now = utcnow()
        payment: Payment = locked_payment(note)
        amount = note.amount_minor(payment.currency)
        check_same_payer(note, payment)
        known = PaymentDispute.get_or_none(
            PaymentDispute.provider == note.provider, PaymentDispute.reference == note.reference
        )
        if known is not None and known.payment_reference != note.payment_reference:
            raise pw.IntegrityError("dispute id known with another payment")
        if known is None:
            PaymentDispute.insert(
                provider=note.provider,
                reference=note.reference,
                payment_reference=note.payment_reference,
                amount_minor=amount,
                currency=payment.currency,
                customer=payment.customer,
                status=DisputeStatus.WITHDRAWN if withdraw else DisputeStatus.REINSTATED,
                event_type=note.event_type,
                received_at=d.received_at,
                withdrawn_at=now if withdraw else None,
                reinstated_at=None if withdraw else now,
            ).execute()
            if withdraw and _refunded_already(note, amount):
                outcome = Outcome(Verdict.DUPLICATE)  # its refund came first and debited it
            elif withdraw:
                save(payment, disputed_minor=payment.disputed_minor + amount)
                move_wallet(note, payment, -amount, now, note.reference)
                outcome = Outcome(Verdict.DEBITED)
            else:
                outcome = Outcome(Verdict.IGNORED, Ignored.NOT_WITHDRAWN)
        elif withdraw or known.status == DisputeStatus.REINSTATED:
            outcome = Outcome(Verdict.DUPLICATE)
        else:  # withdrawn, now given back: what was withdrawn comes back
            back = known.amount_minor
            (
                PaymentDispute.update(status=DisputeStatus.REINSTATED, reinstated_at=now)
                .where(PaymentDispute.id == known.id)
                .execute()
            )
            save(payment, disputed_minor=max(0, payment.disputed_minor - back))
            move_wallet(note, payment, back, now, note.reference)
            outcome = Outcome(Verdict.CREDITED)
        write_call(d, outcome.verdict, 200, note, reason=outcome.reason)
    return outcome


def apply(note: RefundNotification, d: Receipt) -> Outcome:
    """A dispute's money withdrawn or reinstated, once per dispute: DEBITED, CREDITED, DUPLICATE,
    or IGNORED (not_withdrawn: reinstated before anything was withdrawn). Raises as refunds.apply
    does; a dispute id known for another payment is a ReferenceConflict (422, flagged)."""
    try:
        return run_motion(note, d, lambda: _once(note, d))
    except pw.IntegrityError as exc:
        known = PaymentDispute.get_or_none(
            PaymentDispute.provider == note.provider, PaymentDispute.reference == note.reference
        )
        if known is None:
            raise exc
        if known.payment_reference == note.payment_reference:  # two first webhook calls at once
            write_call(d, Verdict.DUPLICATE, 200, note)
            return Outcome(Verdict.DUPLICATE)
        detail = {"known": known.payment_reference, "delivered": note.payment_reference}
        with db.atomic():
            audit.record(
                "payments", "dispute.reference_conflict", "dispute", f"{note.provider}:{note.reference}", detail
            )
            write_call(d, Verdict.REFERENCE_CONFLICT, 422, note)
        raise ReferenceConflict(
            f"dispute {note.reference!r} is already recorded for another payment; nothing moved, flagged for review"
        ) from None
