"""POST /v1/webhooks/<provider>: exactly-once payment webhooks (see DESIGN.md, Payment path)."""
from __future__ import annotations

from flask import Blueprint

bp = Blueprint("payments", __name__)
