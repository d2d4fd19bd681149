"""The wallets' journal (`wallet_entries`, sql/016): every move of a wallet writes one signed
row in its own transaction, so a statement reads rows that add up to the balance. Used by the
payment path (top-ups, refunds, disputes) and by billed sales and their returns."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from webhooks.storage.records import fastsql
from webhooks.storage.records.models import Wallet, WalletEntry


class Entry(StrEnum):
    TOP_UP = "top_up"  # a payment credited (or assigned) to the wallet
    SALE = "sale"  # a billed buyer's lead, debited at settlement
    RETURN = "return"  # a returned lead, credited back
    REFUND = "refund"  # a refund of a top-up (negative), or its reversal (positive)
    DISPUTE = "dispute"  # a dispute's withdrawal (negative), or its reinstatement (positive)
    CARRIED = "carried"  # a wallet's balance when the journal began (sql/016)


def write(
    customer: str,
    currency: str,
    *,
    kind: Entry,
    amount_minor: int,
    reference: str,
    at: datetime,
    deferred: bool = False,
) -> None:
    """One journal row, in the caller's transaction (`deferred`: see fastsql.insert)."""
    row = {
        "customer": customer,
        "currency": currency,
        "kind": kind.value,
        "amount_minor": amount_minor,
        "reference": reference[:300],
        "at": at,
    }
    fastsql.insert(WalletEntry, row, deferred)


def add(customer: str, currency: str, delta_minor: int, at: datetime) -> None:
    """Add `delta_minor` (negative: a debit) to a wallet in the caller's transaction, one
    version more; made at that amount when it never moved. Its journal row is the caller's
    (`write`), which may write several at once."""
    changed = (
        Wallet.update(balance_minor=Wallet.balance_minor + delta_minor, updated_at=at, version=Wallet.version + 1)
        .where(Wallet.customer == customer, Wallet.currency == currency)
        .execute()
    )
    if not changed:
        Wallet.insert(
            customer=customer, currency=currency, balance_minor=delta_minor, updated_at=at, version=1
        ).execute()
