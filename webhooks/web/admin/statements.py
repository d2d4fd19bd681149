"""Admin routes of the monthly statements: a billed buyer's (docs/api.md "Buyer balances") and
a publisher's payouts (docs/api.md "Sales", "Payout holds")."""

from __future__ import annotations

from datetime import datetime, timezone

from flask import Blueprint, Response, stream_with_context
from flask.typing import ResponseReturnValue

from webhooks.billing import statement
from webhooks.errors import ValidationError
from webhooks.leads.accounting import payout_statement
from webhooks.web.http import csv_response, query_arg

bp = Blueprint("statements", __name__)


@bp.get("/buyers/<id:buyer_id>/statement")
def buyer_statement(buyer_id: str) -> ResponseReturnValue:
    """`?month=YYYY-MM` (UTC), `&format=json` (default) or `csv`: streamed a page of lines at a
    time (billing/statement.py), after every check that answers an error."""
    period = statement.month(query_arg("month"), datetime.now(timezone.utc).date())
    shape = _format()
    wallet = statement.billed_wallet(buyer_id)
    if shape == "csv":
        return csv_response(statement.as_csv(wallet, period), f"statement-{buyer_id}-{period.label}.csv")
    opening = statement.opening(wallet, period.start)
    return Response(stream_with_context(statement.as_json(wallet, period, opening)), mimetype="application/json")


@bp.get("/publishers/<id:publisher_id>/statement")
def publisher_statement(publisher_id: str) -> ResponseReturnValue:
    """`?month=YYYY-MM` (UTC; absent: this month), `&format=json` (default) or `csv`: the
    publisher's payouts of the month (leads/accounting/payout_statement.py), streamed."""
    period = payout_statement.month(query_arg("month"), datetime.now(timezone.utc).date())
    shape = _format()
    publisher_id = payout_statement.publisher_id_of(publisher_id)
    if shape == "csv":
        name = f"payouts-{publisher_id}-{period.label}.csv"
        return csv_response(payout_statement.as_csv(publisher_id, period), name)
    return Response(stream_with_context(payout_statement.as_json(publisher_id, period)), mimetype="application/json")


def _format() -> str:
    shape = query_arg("format") or "json"
    if shape not in ("json", "csv"):
        raise ValidationError("invalid_query", "format", "must be json or csv")
    return shape
