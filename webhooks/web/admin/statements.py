"""Admin route of a billed buyer's monthly statement (docs/api.md "Buyer balances")."""

from __future__ import annotations

from datetime import datetime, timezone

from flask import Blueprint, Response, stream_with_context
from flask.typing import ResponseReturnValue

from webhooks.billing import statement
from webhooks.errors import ValidationError
from webhooks.web.http import query_arg

bp = Blueprint("statements", __name__)


@bp.get("/buyers/<id:buyer_id>/statement")
def buyer_statement(buyer_id: str) -> ResponseReturnValue:
    """`?month=YYYY-MM` (UTC), `&format=json` (default) or `csv`: streamed a page of lines at a
    time (billing/statement.py), after every check that answers an error."""
    period = statement.month(query_arg("month"), datetime.now(timezone.utc).date())
    shape = query_arg("format") or "json"
    if shape not in ("json", "csv"):
        raise ValidationError("invalid_query", "format", "must be json or csv")
    wallet = statement.billed_wallet(buyer_id)
    if shape == "csv":
        name = f"statement-{buyer_id}-{period.label}.csv"
        return Response(
            stream_with_context(statement.as_csv(wallet, period)),
            mimetype="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    opening = statement.opening(wallet, period.start)
    return Response(stream_with_context(statement.as_json(wallet, period, opening)), mimetype="application/json")
