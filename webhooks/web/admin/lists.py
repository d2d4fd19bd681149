"""Admin lists (docs/api.md "Lists, partial updates and the operator console"): buyers,
publishers and the lead search, a page at a time: `{"items": [...], "next_cursor": null |
"<opaque>"}`, `?limit=` 1-500 (default 100), `?cursor=` the last page's `next_cursor`.

Each item is what the single GET shows, its Redis parts (cap usage, breaker, balance) among
them, read for the whole page in one round trip each (and the page's wallets in one query)."""

from __future__ import annotations

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.leads.rules import buyer_service, publisher_service
from webhooks.storage.records.models import Buyer, Publisher
from webhooks.web.listing import lead_page, page_of

bp = Blueprint("lists", __name__)


@bp.get("/buyers")
def list_buyers() -> ResponseReturnValue:
    """Buyers not deleted, by id, each as GET /v1/admin/buyers/<id> shows it."""
    rows, next_cursor = page_of(Buyer.select().where(Buyer.deleted_at.is_null()), Buyer.id)
    return jsonify({"items": buyer_service.shown(services.current().store, rows), "next_cursor": next_cursor})


@bp.get("/publishers")
def list_publishers() -> ResponseReturnValue:
    """Publishers, by id, each as GET /v1/admin/publishers/<id> shows it."""
    rows, next_cursor = page_of(Publisher.select(), Publisher.id)
    return jsonify({"items": publisher_service.shown(services.current().store, rows), "next_cursor": next_cursor})


@bp.get("/leads")
def search_leads() -> ResponseReturnValue:
    """The ledger's leads, newest first (received_at, then the row), filtered by publisher_id,
    buyer_id, status (the ledger's: sold, unsold, returned, test_sold, test_unsold), since
    (inclusive) and until (exclusive); each as GET /v1/admin/leads/<id> shows it."""
    page = lead_page()
    return jsonify({"items": page.items, "next_cursor": page.next_cursor})
