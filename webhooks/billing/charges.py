"""The wallet moves of billed sales: a sale's debit, written in the settlement's transaction,
and a return's credit, each with its journal row (billing/wallets.py). The balance Redis
holds takes them afterwards (billing/balance.py sync)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

from webhooks.billing import wallets
from webhooks.billing.wallets import Entry
from webhooks.storage.records.models import WalletEntry


class Charged(NamedTuple):
    """What a billed sale debits: the wallet ("<account>|<currency>") and the amount."""

    account: str
    minor: int

    @property
    def wallet(self) -> tuple[str, str]:
        account, currency = self.account.rsplit("|", 1)
        return account, currency


def move(account: str, currency: str, delta_minor: int, now: datetime, *, entry: Entry, reference: str) -> None:
    """Add `delta_minor` to a wallet, in the caller's transaction (a sale's debit, a return's
    credit), with its journal row: one version more. Made at that amount when it never moved."""
    wallets.write(account, currency, kind=entry, amount_minor=delta_minor, reference=reference, at=now)
    wallets.add(account, currency, delta_minor, now)


def debit_sales(sales: Sequence[tuple[Charged, str]], now: datetime) -> None:
    """Billed sales just written to the ledger, each (its charge, "publisher:lead_id"): in the
    caller's transaction, one move per wallet (the sum) and one journal row per sale."""
    by_wallet: dict[tuple[str, str], int] = {}
    for charged, _ in sales:
        by_wallet[charged.wallet] = by_wallet.get(charged.wallet, 0) + charged.minor
    for (account, currency), total in sorted(by_wallet.items()):
        wallets.add(account, currency, -total, now)
    rows = [
        {
            "customer": charged.wallet[0],
            "currency": charged.wallet[1],
            "kind": Entry.SALE.value,
            "amount_minor": -charged.minor,
            "reference": reference,
            "at": now,
        }
        for charged, reference in sales
    ]
    if rows:
        WalletEntry.insert_many(rows).execute()
