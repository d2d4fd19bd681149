"""The ceiling: a bare Flask endpoint on the same gunicorn settings as Floodgate, answering a
lead-sized JSON without doing anything."""

from __future__ import annotations

from flask import Flask, jsonify, request

app = Flask(__name__)


@app.post("/v1/leads")
def lead():
    body = request.get_json()
    return jsonify(
        lead_id=body.get("lead_id"),
        status="sold",
        buyer_id="acme",
        price="12.50",
        attempts=[{"buyer_id": "acme", "outcome": "accepted", "ms": 20}],
    )
