"""A billed buyer's balance: a cap that payments raise, one per wallet (docs/buyers.md
"Balances").

The ledger is the truth: a wallet (`wallets`, one per account and currency) is credited by
top-ups through the payment path, debited by each sale in the settlement's transaction and
credited back by a return (billing/charges.py), and every change counts one more `version`.
Redis holds one copy per wallet, which every buyer billed from it draws on (keys.balance_of: the
wallet's own key on one Redis; on a Redis Cluster a wallet is one buyer's alone and the copy
sits beside its cap keys): `wallet` and `version` as the ledger last said, and `held`, the
prices of the live leases and of the sales the ledger does not have yet of every such buyer. A
reservation holds the price in the same Lua script as the caps (lua/reserve_lease.lua); a refund
gives it back (lua/finish_lease.lua); after a ledger change commits, `sync` takes the new figure
if its version is newer and gives back what the settled leases held (lua/sync_balance.lua), so
no change counts twice. After a data loss the balance is rebuilt with the counters
(caps/rebuild.py), and until then nothing is sold from the wallet. A sync that leaves more to
spend (a top-up) starts a new `cycle` of the balance: the balance events
(billing/balance_events.py) go out once per buyer and cycle."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from webhooks.billing.charges import Charged
from webhooks.errors import Conflict, InvalidPayload, ValidationError
from webhooks.formats import money
from webhooks.storage.live import keys
from webhooks.storage.live.redis import REDIS_DOWN, Store
from webhooks.storage.live.scripts import Balance, Hold, LedgerBalance
from webhooks.storage.records.models import Buyer, Wallet

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
        return wallet_key(self.account, self.currency)

    @property
    def floor_minor(self) -> int:
        return -self.credit_limit_minor if self.mode == CREDIT else 0

    def hold(self, price_minor: int) -> Hold:
        return Hold(price_minor, self.floor_minor, self.key)

    def available_minor(self, held: Balance) -> int:
        """What the next reservation can spend of the balance Redis holds."""
        return held.wallet_minor - held.held_minor - self.floor_minor

    def text(self, minor: int) -> str:
        """Minor units of this wallet's currency as the API writes them ("12.50")."""
        return money.text(minor, self.currency)

    def minor(self, amount: Decimal | str) -> int:
        """An amount in this wallet's currency, in its minor units (ValueError: not a whole
        number of them, e.g. 12.50 in JPY)."""
        try:
            return money.to_minor(str(amount), self.currency, major=True)
        except InvalidPayload as exc:
            raise ValueError(str(exc)) from None

    def charge(self, price: Decimal) -> Charged | None:
        """What a sale at `price` debits (None: a price this currency cannot count, which the
        buyer's validation refuses for its own price)."""
        try:
            return Charged(self.key, self.minor(price))
        except ValueError:
            return None

    def to_json(self) -> str:
        out: dict[str, Any] = {"mode": self.mode, "account": self.account, "currency": self.currency}
        if self.mode == CREDIT:
            out["credit_limit"] = money.text(self.credit_limit_minor, self.currency)
        if self.low_balance_minor is not None:
            out["low_balance"] = money.text(self.low_balance_minor, self.currency)
        return json.dumps(out, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> Billing | None:
        """The stored form (buyers.billing)."""
        if not text:
            return None
        raw = json.loads(text)
        currency = raw["currency"]
        low = raw.get("low_balance")
        return cls(
            mode=raw["mode"],
            account=raw["account"],
            currency=currency,
            credit_limit_minor=money.to_minor(raw["credit_limit"], currency, major=True)
            if raw.get("credit_limit")
            else 0,
            low_balance_minor=None if low is None else money.to_minor(low, currency, major=True),
        )


def wallet_key(account: str, currency: str) -> str:
    """How a wallet is named beside a buyer: buyers.billing_account, the balance hash's
    `account`, a sale's charge."""
    return f"{account}|{currency}"


def ledger_wallet(billing: Billing, unsettled_minor: int = 0) -> LedgerBalance:
    """The wallet as the ledger has it now (0 at version 0 when it has never moved)."""
    return _ledger(billing.account, billing.currency, unsettled_minor)


def _ledger(account: str, currency: str, unsettled_minor: int = 0) -> LedgerBalance:
    row = (
        Wallet.select(Wallet.balance_minor, Wallet.version)
        .where(Wallet.customer == account, Wallet.currency == currency)
        .first()
    )
    key = wallet_key(account, currency)
    if row is None:
        return LedgerBalance(key, 0, 0, unsettled_minor)
    return LedgerBalance(key, int(row.balance_minor), int(row.version), unsettled_minor)


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


def sync_settled(store: Store, sales: Sequence[tuple[str, str, Charged]]) -> dict[str, Balance]:
    """After billed sales (buyer id, lease id, charge) committed to the ledger: each buyer's
    Redis balance takes its wallet's figure and gives back what those leases held, before
    the leases are deleted (a lease gone already is reconciled, never counted twice). Returns
    what Redis holds after the sync, by buyer (none for a balance not known, or not synced)."""
    by_buyer: dict[tuple[str, tuple[str, str]], list[str]] = {}  # (buyer, its wallet) -> leases
    for buyer_id, lease_id, charged in sales:
        by_buyer.setdefault((buyer_id, charged.wallet), []).append(lease_id)
    synced: dict[str, Balance] = {}
    for (buyer_id, (account, currency)), lease_ids in by_buyer.items():
        try:
            after = store.sync_balance(buyer_id, _ledger(account, currency), lease_ids)
        except REDIS_DOWN as exc:
            log.warning("balance of buyer %s not synced after its sales (Redis unavailable): %s", buyer_id, exc)
            continue
        if after is not None:
            synced[buyer_id] = after
    return synced


def held_now(store: Store, billed: Sequence[tuple[str, Billing]]) -> dict[str, Balance]:
    """What Redis holds of the balances these billed buyers (buyer id, billing) draw on, in one
    round trip, by buyer: none for a balance not known, or without a cycle yet (rebuilt after a
    data loss, not synced since), and none at all while Redis does not answer."""
    if not billed:
        return {}
    try:
        pipe = store.redis.pipeline(transaction=False)
        for buyer_id, billing in billed:
            pipe.hmget(store.balance_key(buyer_id, billing.key), "wallet", "held", "cycle")
        replies: list[Any] = pipe.execute()
    except REDIS_DOWN as exc:
        log.warning("balances of %d buyers not read (Redis unavailable): %s", len(billed), exc)
        return {}
    return {
        buyer_id: Balance(int(wallet), int(held or 0), int(cycle))
        for (buyer_id, _), (wallet, held, cycle) in zip(billed, replies)
        if wallet is not None and cycle is not None
    }


def wallet_buyers(key: str) -> list[str]:
    """Every buyer billed from the wallet `key` ("<account>|<currency>"), deleted ones too (a
    lease of any may still hold on it)."""
    return [row.id for row in Buyer.select(Buyer.id).where(Buyer.billing_account == key)]


WALLET_LOCK_MS = 10_000  # longer than a buyer's write takes; a crashed holder frees it then
WALLET_LOCK_WAIT_S = 5.0


@contextmanager
def wallet_lock(store: Store, billing: Billing | None) -> Iterator[None]:
    """Hold the wallet's lock (Redis, one per wallet) while a buyer billed from it is checked
    (check_wallet) and written, so that two buyers written at once cannot give it two floors.
    Waits for another writer of the same wallet up to WALLET_LOCK_WAIT_S (Conflict after)."""
    if billing is None:
        yield
        return
    key, token = keys.wallet_lock(billing.key), uuid.uuid4().hex
    deadline = time.monotonic() + WALLET_LOCK_WAIT_S
    while not store.redis.set(key, token, nx=True, px=WALLET_LOCK_MS):
        if time.monotonic() > deadline:
            raise Conflict("another change of this wallet's buyers is under way; retry")
        time.sleep(0.02)
    try:
        yield
    finally:
        store.release_claim(key, token)


def check_wallet(buyer_id: str, billing: Billing | None, *, shared: bool) -> None:
    """Refuse (ValidationError) a billing that would give one wallet two floors: every buyer of a
    wallet spends down to the same one, so a `credit_limit` (or a mode) that differs from
    another live buyer's of that wallet is refused; and, where wallets are not `shared` (a Redis
    Cluster: docs/cluster.md "Wallets"), a second buyer of a wallet at all."""
    if billing is None:
        return
    others = Buyer.select(Buyer.id, Buyer.billing).where(
        Buyer.billing_account == billing.key, Buyer.id != buyer_id, Buyer.deleted_at.is_null()
    )
    for row in others.order_by(Buyer.id):
        other = Billing.from_json(row.billing)
        if other is None:
            continue
        if not shared:
            raise ValidationError(
                "invalid_buyer", "billing.account", f"is billed to buyer {row.id!r} already (one buyer per wallet)"
            )
        if other.floor_minor != billing.floor_minor:
            limit = other.text(other.credit_limit_minor) if other.mode == CREDIT else "none (prepaid)"
            raise ValidationError(
                "invalid_buyer",
                "billing.credit_limit",
                f"must be the same for every buyer of the wallet: buyer {row.id!r} has {limit}",
            )


def sync_wallet(store: Store, account: str, currency: str) -> None:
    """After a payment, refund or dispute moved a wallet: the balance its buyers draw on takes
    the new figure (one indexed read; nothing when no buyer pays from that wallet). On a
    cluster each buyer's own copy does."""
    key = wallet_key(account, currency)
    synced: set[str] = set()
    for row in Buyer.select(Buyer.id, Buyer.billing).where(Buyer.billing_account == key, Buyer.deleted_at.is_null()):
        billing = Billing.from_json(row.billing)
        if billing is not None and store.balance_key(row.id, billing.key) not in synced:
            synced.add(store.balance_key(row.id, billing.key))
            sync(store, row.id, billing)


def shown(store: Store, buyer_id: str, billing: Billing) -> dict[str, Any]:
    """GET /v1/admin/buyers/<id>'s `balance`: the ledger's wallet, what every buyer of the
    wallet holds in Redis, and what the next reservation can spend (null while Redis does not
    know the balance)."""
    return shown_many(store, [(buyer_id, billing)])[buyer_id]


WALLETS_PER_QUERY = 500  # accounts per IN list (SQLite's bound on a query's parameters)


def shown_many(store: Store, billed: Sequence[tuple[str, Billing]]) -> dict[str, dict[str, Any]]:
    """`shown` of many billed buyers (buyer id, billing) at once, by buyer id, for the /ops
    page: the ledger's wallets in one query (per WALLETS_PER_QUERY accounts), what Redis holds
    in one round trip."""
    if not billed:
        return {}
    wanted = {(billing.account, billing.currency) for _, billing in billed}
    accounts = sorted({account for account, _ in wanted})
    currencies = sorted({currency for _, currency in wanted})  # a filter: the dict matches pairs
    minor: dict[tuple[str, str], int] = {}
    for i in range(0, len(accounts), WALLETS_PER_QUERY):
        chunk = accounts[i : i + WALLETS_PER_QUERY]
        rows = Wallet.select(Wallet.customer, Wallet.currency, Wallet.balance_minor).where(
            Wallet.customer.in_(chunk), Wallet.currency.in_(currencies)
        )
        minor.update({(row.customer, row.currency): int(row.balance_minor) for row in rows})
    try:
        pipe = store.redis.pipeline(transaction=False)
        for buyer_id, billing in billed:
            pipe.hmget(store.balance_key(buyer_id, billing.key), "wallet", "held")
        replies: list[Any] = pipe.execute()
    except REDIS_DOWN:
        replies = [(None, None)] * len(billed)
    out = {}
    for (buyer_id, billing), (redis_wallet, held) in zip(billed, replies):
        known = redis_wallet is not None
        available = int(redis_wallet) - int(held or 0) - billing.floor_minor if known else None
        out[buyer_id] = {
            "currency": billing.currency,
            "available": None if available is None else money.text(available, billing.currency),
            "wallet": money.text(minor.get((billing.account, billing.currency), 0), billing.currency),
            "reserved": money.text(int(held or 0), billing.currency) if known else None,
        }
    return out
