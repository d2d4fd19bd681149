"""Operator users on the HTTP face (docs/api.md "Operator users"): the admin API's
`/v1/admin/users` (api.py, under the bearer ADMIN_TOKEN), the console's user pages (pages.py,
under the /ops session, webhooks/web/sessions.py) and the set-up page an invitation links to
(setup.py, its token the only key). The accounts themselves: webhooks/people/."""

from __future__ import annotations

from flask import Blueprint

from webhooks.web.people import api, pages, setup

bp = Blueprint("people", __name__, template_folder="templates")
for routes in (pages, setup):
    bp.register_blueprint(routes.bp)
api_bp = api.bp
