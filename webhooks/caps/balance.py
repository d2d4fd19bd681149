"""A billed buyer's balance: a cap that payments raise (docs/buyers.md "Balances").

The ledger is the truth: the buyer's wallet (`wallets`, one per account and currency) is
credited by top-ups through the payment path, debited by each sale in the settlement's
transaction and credited back by a return, and every change counts one more `version`. Redis
holds a copy beside the buyer's cap keys (keys.balance, same hash tag): `wallet` and `version`
as the ledger last said, and `held`, the prices of live leases and of sales the ledger does
not have yet. A reservation holds the price in the same Lua script as the caps
(lua/reserve_lease.lua); a refund gives it back (lua/finish_lease.lua); after a ledger change
commits, `sync` takes the new figure if its version is newer and gives back what the settled
leases held (lua/sync_balance.lua), so no change counts twice. After a data loss the balance
is rebuilt with the counters (caps/rebuild.py), and until then nothing is sold to the buyer."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhooks.storage import wallets
from webhooks.storage.models import Buyer, Wallet
from webhooks.storage.redis import REDIS_DOWN, Store
from webhooks.storage.scripts import NO_HOLD, Balance, Hold, LedgerBalance
from webhooks.storage.wallets import Entry

log = logging.getLogger(__name__)

PREPAID, CREDIT = "prepaid", "credit"


@dataclass(frozen=True, kw_only=True)
class Billing:
    """How a buyer pays for its leads: from the wallet `account` in `currency`, down to 0
    (prepaid) or to minus `credit_limit_minor` (credit)."""

    mode: str
    account: str
    currency: str
    credit_limit_minor: int = 0
    low_balance_minor: int | None = None

    @property
    def key(self) -> str:
        """The wallet's "<account>|<currency>", as buyers.billing_account and the balance hold it."""
        return f"{self.account}|{self.currency}"

    @property
    def floor_minor(self) -> int:
        return -self.credit_limit_minor if self.mode == CREDIT else 0

    def hold(self, price_minor: int) -> Hold:
        return Hold(price_minor, self.floor_minor)

    @classmethod
    def from_json(cls, text: str | None, minor: Any) -> Billing | None:
        """The stored form (buyers.billing), amounts made minor units by `minor(decimal text)`."""
        if not text:
            return None
        raw = json.loads(text)
        low = raw.get("low_balance")
        return cls(
            mode=raw["mode"],
            account=raw["account"],
            currency=raw["currency"],
            credit_limit_minor=minor(raw["credit_limit"]) if raw.get("credit_limit") else 0,
            low_balance_minor=None if low is None else minor(low),
        )


def hold_for(billing: Billing | None, price_minor: int) -> Hold:
    return NO_HOLD if billing is None else billing.hold(price_minor)


def ledger_wallet(billing: Billing, unsettled_minor: int = 0) -> LedgerBalance:
    """The wallet as the ledger has it now (0 at version 0 when it has never moved)."""
    row = (
        Wallet.select(Wallet.balance_minor, Wallet.version)
        .where(Wallet.customer == billing.account, Wallet.currency == billing.currency)
        .first()
    )
    if row is None:
        return LedgerBalance(billing.key, 0, 0, unsettled_minor)
    return LedgerBalance(billing.key, int(row.balance_minor), int(row.version), unsettled_minor)


def move(account: str, currency: str, delta_minor: int, now: datetime, *, entry: Entry, reference: str) -> None:
    """Add `delta_minor` to a wallet, in the caller's transaction (a sale's debit, a return's
    credit), with its journal row: one version more. Made at that amount when it never moved."""
    wallets.write(account, currency, entry, delta_minor, reference, now)
    changed = (
        Wallet.update(balance_minor=Wallet.balance_minor + delta_minor, updated_at=now, version=Wallet.version + 1)
        .where(Wallet.customer == account, Wallet.currency == currency)
        .execute()
    )
    if not changed:
        Wallet.insert(
            customer=account, currency=currency, balance_minor=delta_minor, updated_at=now, version=1
        ).execute()


def sync(
    store: Store, buyer_id: str, billing: Billing, settled_leases: Sequence[str] = (), *, init: bool = False
) -> Balance | None:
    """After a change of the buyer's wallet committed (or, `init`, when the buyer was just
    billed): Redis takes the ledger's figure. A Redis outage is left to the next change, the
    reconciliation or the rebuild: the figure Redis keeps meanwhile is never too high for
    longer than a top-up takes to show (a sale's debit is held already)."""
    try:
        return store.sync_balance(buyer_id, ledger_wallet(billing), settled_leases, init=init)
    except REDIS_DOWN as exc:
        log.warning("balance of buyer %s not synced with the ledger (Redis unavailable): %s", buyer_id, exc)
        return None


def sync_wallet(store: Store, account: str, currency: str) -> None:
    """After a payment, refund or dispute moved a wallet: each buyer billed from it takes the
    new figure (one indexed read; none when no buyer pays from that wallet)."""
    key = f"{account}|{currency}"
    for row in Buyer.select(Buyer.id, Buyer.billing).where(Buyer.billing_account == key, Buyer.deleted_at.is_null()):
        billing = Billing.from_json(row.billing, _minor)
        if billing is not None:
            sync(store, row.id, billing)


def shown(store: Store, buyer_id: str, billing: Billing) -> dict[str, Any]:
    """GET /v1/admin/buyers/<id>'s `balance`: the ledger's wallet, what is held in Redis, and
    what the next reservation can spend (null while Redis does not know the balance)."""
    wallet = ledger_wallet(billing)
    held: int | None
    try:
        raw = store.redis.hmget(_key(buyer_id), "wallet", "held")
        held = None if raw[0] is None else int(raw[1] or 0)
        redis_wallet = None if raw[0] is None else int(raw[0])
    except REDIS_DOWN:
        held, redis_wallet = None, None
    available = None if held is None or redis_wallet is None else redis_wallet - held - billing.floor_minor
    return {
        "currency": billing.currency,
        "available": None if available is None else _text(available),
        "wallet": _text(wallet.wallet_minor),
        "reserved": None if held is None else _text(held),
    }


def _key(buyer_id: str) -> str:
    from webhooks.storage import keys

    return keys.balance(buyer_id)


def _minor(text: str) -> int:
    from webhooks.validate import cents

    return cents(text)


def _text(minor: int) -> str:
    sign = "-" if minor < 0 else ""
    return f"{sign}{abs(minor) // 100}.{abs(minor) % 100:02d}"
