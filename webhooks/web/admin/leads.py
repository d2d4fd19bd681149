"""Admin routes that read the ledger."""
from __future__ import annotations

from flask import jsonify, request

from webhooks.errors import Conflict, NotFound
from webhooks.leads.ledger import lead_record
from webhooks.storage.models import Lead
from webhooks.validate import is_id
from webhooks.web.admin import bp


@bp.get("/leads/<id:lead_id>")
def get_lead(lead_id: str):
    query = Lead.select().where(Lead.lead_id == lead_id)
    publisher_id = request.args.get("publisher_id")
    if publisher_id is not None:
        if not is_id(publisher_id):
            raise NotFound("no such lead")
        query = query.where(Lead.publisher_id == publisher_id)
    rows = list(query.limit(2))
    if not rows:
        raise NotFound(f"lead {lead_id!r} is not settled (yet)")
    if len(rows) > 1:
        raise Conflict("several publishers used this lead_id; add ?publisher_id=",
                       code="ambiguous_lead_id")
    return jsonify(lead_record(rows[0]))
