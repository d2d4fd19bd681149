"""Admin routes for buyers."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from flask import jsonify
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.billing import balance
from webhooks.billing.balance import Billing
from webhooks.caps import leases
from webhooks.caps.breaker import breakers
from webhooks.errors import NotFound
from webhooks.leads.path import preview
from webhooks.leads.rules import buyers
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.leads.rules.catalog import bump_version
from webhooks.storage.live.batch import Client
from webhooks.storage.records.models import Buyer
from webhooks.web.admin import bp
from webhooks.web.http import json_body, merge_patch, patch_body


def _redis() -> Client:
    return services.current().store.redis


@bp.put("/buyers/<id:buyer_id>")
def put_buyer(buyer_id: str) -> ResponseReturnValue:
    stored = Buyer.get_or_none(Buyer.id == buyer_id)
    return jsonify(buyers.to_json(save(buyer_id, buyers.parse(json_body(), stored))))


@bp.patch("/buyers/<id:buyer_id>")
def patch_buyer(buyer_id: str) -> ResponseReturnValue:
    stored = live(buyer_id)  # 404 before the body is looked at
    return jsonify(buyers.to_json(patch(stored, patch_body(buyers.CODE))))


def live(buyer_id: str) -> Buyer:
    """The buyer, not deleted; 404 not_found otherwise."""
    row = Buyer.get_or_none(Buyer.id == buyer_id, Buyer.deleted_at.is_null())
    if row is None:
        raise NotFound(f"no buyer {buyer_id!r}")
    return row


def patch(stored: Buyer, changes: dict[str, Any]) -> Buyer:
    """Apply a JSON merge patch (RFC 7396) to the buyer as GET shows it: fields not named are
    kept, its credentials among them (shown redacted, they are kept when sent back as shown)."""
    return save(stored.id, buyers.parse(merge_patch(buyers.to_json(stored), changes), stored))


def save(buyer_id: str, fields: dict[str, Any]) -> Buyer:
    """Store a buyer's validated fields (buyers.parse) and tell every process: its counters
    ready when new, its wallet known to Redis when billed, the config version bumped."""
    store, billing = services.current().store, Billing.from_json(fields.get("billing"))
    with balance.wallet_lock(store, billing):  # one floor per wallet, however many write at once
        balance.check_wallet(buyer_id, billing, shared=store.shared_wallets)
        row, created = buyers.save(buyer_id, fields)
    r = _redis()
    if created:
        leases.mark_ready(r, buyer_id)
    if billing is not None:  # Redis learns the wallet before any process sees the buyer billed
        balance.sync(store, buyer_id, billing, init=True)
    bump_version(r)
    return row


@bp.get("/buyers/<id:buyer_id>")
def get_buyer(buyer_id: str) -> ResponseReturnValue:
    return jsonify(shown([live(buyer_id)])[0])


def shown(rows: list[Buyer]) -> list[dict[str, Any]]:
    """Buyers as GET /v1/admin/buyers/<id> shows each (and the list, a page of them): the
    stored form, the live `usage` of each cap, the `breaker`, a billed one's `balance`; the
    Redis parts of them all read in one round trip each, their wallets in one query."""
    store = services.current().store
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


@bp.delete("/buyers/<id:buyer_id>")
def delete_buyer(buyer_id: str) -> ResponseReturnValue:
    if not buyers.delete(buyer_id):
        raise NotFound(f"no buyer {buyer_id!r}")
    bump_version(_redis())
    return "", 204


@bp.post("/buyers/<id:buyer_id>/preview")
def preview_buyer(buyer_id: str) -> ResponseReturnValue:
    """The request Floodgate would send this buyer for a sample lead: nothing is sent,
    reserved or stored."""
    row = Buyer.get_or_none(Buyer.id == buyer_id, Buyer.deleted_at.is_null())
    if row is None:
        raise NotFound(f"no buyer {buyer_id!r}")
    return jsonify(preview.request_for(BuyerRule.from_row(row), json_body()))
