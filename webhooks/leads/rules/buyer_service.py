"""A buyer's changes as the admin API, the console and the CLI all make them: stored, then told
to every process (its counters ready when new, a billed one's balance known to Redis, the
config version bumped), and a buyer as those faces show it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from webhooks.billing import balance
from webhooks.billing.balance import Billing
from webhooks.caps import leases
from webhooks.caps.breaker import breakers
from webhooks.errors import NotFound
from webhooks.formats.validate import merge_patch
from webhooks.leads.rules import buyers
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.leads.rules.catalog import bump_version
from webhooks.storage.live.redis import Store
from webhooks.storage.records.models import Buyer


def live(buyer_id: str) -> Buyer:
    """The buyer, not deleted; NotFound otherwise."""
    row = Buyer.get_or_none(Buyer.id == buyer_id, Buyer.deleted_at.is_null())
    if row is None:
        raise NotFound(f"no buyer {buyer_id!r}")
    return row


def save(store: Store, buyer_id: str, fields: dict[str, Any]) -> Buyer:
    """Store a buyer's validated fields (buyers.parse) and tell every process."""
    saved = write(store, buyer_id, fields)
    announce(store, [saved])
    return saved[0]


def patch(store: Store, stored: Buyer, changes: dict[str, Any]) -> Buyer:
    """Apply a JSON merge patch (RFC 7396) to the buyer as GET shows it (`patched`) and save it."""
    return save(store, stored.id, patched(stored, changes))


def patched(stored: Buyer, changes: dict[str, Any]) -> dict[str, Any]:
    """The buyer's columns after a JSON merge patch (RFC 7396) of it as GET shows it, checked
    (ValidationErrors naming each bad field), not saved: fields not named are kept, its
    credentials among them (shown redacted, they are kept when sent back as shown). GET shows
    the return window twice (`return_window_days`, `returns.window_days`): the one the patch
    names is the one that changes."""
    base = buyers.to_json(stored)
    policy = changes.get("returns")
    if isinstance(policy, dict) and "window_days" in policy:  # null too: back to the default
        del base["return_window_days"]
    elif "return_window_days" in changes:
        del base["returns"]["window_days"]
    return buyers.parse(merge_patch(base, changes), stored)


def set_active(store: Store, rows: Sequence[Buyer], active: bool) -> list[Buyer]:
    """Pause (or resume) several buyers at once (one audit row each, as `patch` with
    {"active": ...} leaves), in one transaction, told to every process once: only `active`
    changes (buyers.set_active), so a buyer deleted or edited since `rows` were read stays
    as it is now. The buyers changed: those of `rows` still live."""
    changed = buyers.set_active([row.id for row in rows], active)
    announce(store, [(row, False) for row in changed])
    return changed


def write(store: Store, buyer_id: str, fields: dict[str, Any]) -> tuple[Buyer, bool]:
    """The database half of `save`: (row, created). `announce` it once committed (an import
    writes many in one transaction, then announces them all)."""
    billing = Billing.from_json(fields.get("billing"))
    with balance.wallet_lock(store, billing):  # one floor per wallet, however many write at once
        balance.check_wallet(buyer_id, billing, shared=store.shared_wallets)
        return buyers.save(buyer_id, fields)


def announce(store: Store, saved: Sequence[tuple[Buyer, bool]]) -> None:
    """Tell every process of buyers written (row, created): new ones' counters ready, billed
    ones' wallets known to Redis before any process sees them billed, the version bumped."""
    for row, created in saved:
        if created:
            leases.mark_ready(store.redis, row.id)
        billing = Billing.from_json(row.billing)
        if billing is not None:
            balance.sync(store, row.id, billing, init=True)
    bump_version(store.redis)


def delete(store: Store, buyer_id: str) -> None:
    """Soft-delete the buyer (NotFound for none) and tell every process."""
    if not buyers.delete(buyer_id):
        raise NotFound(f"no buyer {buyer_id!r}")
    bump_version(store.redis)


def shown(store: Store, rows: list[Buyer]) -> list[dict[str, Any]]:
    """Buyers as GET /v1/admin/buyers/<id> shows each (and the list, a page of them): the
    stored form, the live `usage` of each cap, the `breaker`, a billed one's `balance`; the
    Redis parts of them all read in one round trip each, their wallets in one query."""
    usage = leases.usage_many(store.redis, [BuyerRule.from_row(row) for row in rows], datetime.now(timezone.utc))
    states = breakers(store.redis, [row.id for row in rows])
    billed = [(row.id, billing) for row in rows if (billing := Billing.from_json(row.billing)) is not None]
    balances = balance.shown_many(store, billed)
    items = []
    for row in rows:
        item = {**buyers.to_json(row), "usage": usage[row.id], "breaker": states[row.id].as_json()}
        if row.id in balances:
            item["balance"] = balances[row.id]
        items.append(item)
    return items
