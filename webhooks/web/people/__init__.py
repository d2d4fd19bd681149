"""Operator users (docs/api.md "Operator users"): accounts, their login and roles, the admin
API's `/v1/admin/users` and the console's user and set-up pages (nested under /ops's session
check by webhooks/web/ops/__init__.py)."""
