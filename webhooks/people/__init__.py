"""Operator users (docs/api.md "Operator users"): their accounts (invitation, one-time set-up,
argon2id passwords, TOTP) and what each role may do. No Flask here: the HTTP face's login
(webhooks/web/logins.py, webhooks/web/sessions.py) and pages (webhooks/web/people/) call it."""
