"""Operations endpoints: liveness and readiness."""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify

from ..db import UNAVAILABLE_ERRORS, db
from ..store import REDIS_DOWN

bp = Blueprint("ops", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz():
    down = []
    try:
        current_app.extensions["redis"].ping()
    except REDIS_DOWN:
        down.append("redis")
    try:
        with db.connection_context():
            db.execute_sql("SELECT 1")
    except UNAVAILABLE_ERRORS:
        down.append("database")
    if down:
        body = {"error": {"code": "unavailable", "message": "not ready: " + ", ".join(down) + " down"},
                "down": down}
        return jsonify(body), 503
    return jsonify(status="ready")
