"""Exactly-once payment webhooks: provider signatures, provider notifications, money parsing and
the payment ledger."""
