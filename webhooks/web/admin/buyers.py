"""Admin routes for buyers (their changes: leads/rules/buyer_service.py), and a buyer's API key."""

from __future__ import annotations

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

from webhooks import services
from webhooks.errors import NotFound
from webhooks.leads.path import preview
from webhooks.leads.rules import buyer_keys, buyer_service, buyers
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.storage.records.models import Buyer
from webhooks.web.http import json_body, patch_body

bp = Blueprint("buyers", __name__)


@bp.put("/buyers/<id:buyer_id>")
def put_buyer(buyer_id: str) -> ResponseReturnValue:
    stored = Buyer.get_or_none(Buyer.id == buyer_id)
    fields = buyers.parse(json_body(), stored)
    return jsonify(buyers.to_json(buyer_service.save(services.current().store, buyer_id, fields)))


@bp.patch("/buyers/<id:buyer_id>")
def patch_buyer(buyer_id: str) -> ResponseReturnValue:
    stored = buyer_service.live(buyer_id)  # 404 before the body is looked at
    changed = buyer_service.patch(services.current().store, stored, patch_body(buyers.CODE))
    return jsonify(buyers.to_json(changed))


@bp.get("/buyers/<id:buyer_id>")
def get_buyer(buyer_id: str) -> ResponseReturnValue:
    return jsonify(buyer_service.shown(services.current().store, [buyer_service.live(buyer_id)])[0])


@bp.delete("/buyers/<id:buyer_id>")
def delete_buyer(buyer_id: str) -> ResponseReturnValue:
    buyer_service.delete(services.current().store, buyer_id)
    return "", 204


@bp.post("/buyers/<id:buyer_id>/preview")
def preview_buyer(buyer_id: str) -> ResponseReturnValue:
    """The request Floodgate would send this buyer for a sample lead: nothing is sent,
    reserved or stored."""
    row = Buyer.get_or_none(Buyer.id == buyer_id, Buyer.deleted_at.is_null())
    if row is None:
        raise NotFound(f"no buyer {buyer_id!r}")
    return jsonify(preview.request_for(BuyerRule.from_row(row), json_body()))


@bp.post("/buyers/<id:buyer_id>/api-key")
def issue_api_key(buyer_id: str) -> ResponseReturnValue:
    """A new API key for the buyer, shown in this answer only (only its hash is kept), the one
    it had before refused from now on (docs/buyers.md "The buyer API")."""
    resp = jsonify({"api_key": buyer_keys.issue(buyer_id)})
    resp.status_code = 201
    resp.headers["Cache-Control"] = "no-store"  # a secret: no cache on the way keeps it
    return resp
