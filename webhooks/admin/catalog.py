"""Admin routes for publishers and buyers."""
from __future__ import annotations

from datetime import datetime, timezone

from flask import current_app, jsonify

from .. import buyers, caps, publishers
from ..buyers import BuyerRule
from ..catalog import bump_version
from ..errors import NotFound
from ..http import json_body
from ..models import Buyer, Publisher
from . import bp


def _redis():
    return current_app.extensions["redis"]


@bp.put("/publishers/<id:publisher_id>")
def put_publisher(publisher_id: str):
    row = publishers.save(publisher_id, publishers.parse(json_body()))
    bump_version(_redis())
    return jsonify(publishers.to_json(row))


@bp.get("/publishers/<id:publisher_id>")
def get_publisher(publisher_id: str):
    row = Publisher.get_or_none(Publisher.id == publisher_id)
    if row is None:
        raise NotFound(f"no publisher {publisher_id!r}")
    return jsonify(publishers.to_json(row))


@bp.put("/buyers/<id:buyer_id>")
def put_buyer(buyer_id: str):
    row, created = buyers.save(buyer_id, buyers.parse(json_body()))
    r = _redis()
    if created:
        caps.mark_ready(r, buyer_id)
    bump_version(r)
    return jsonify(buyers.to_json(row))


@bp.get("/buyers/<id:buyer_id>")
def get_buyer(buyer_id: str):
    row = Buyer.get_or_none(Buyer.id == buyer_id, Buyer.deleted_at.is_null())
    if row is None:
        raise NotFound(f"no buyer {buyer_id!r}")
    body = buyers.to_json(row)
    body["usage"] = caps.usage(_redis(), BuyerRule.from_row(row), datetime.now(timezone.utc))
    return jsonify(body)


@bp.delete("/buyers/<id:buyer_id>")
def delete_buyer(buyer_id: str):
    if not buyers.delete(buyer_id):
        raise NotFound(f"no buyer {buyer_id!r}")
    bump_version(_redis())
    return "", 204
