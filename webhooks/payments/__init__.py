"""Exactly-once payment webhooks: provider signatures, provider events, money parsing and
the payment ledger."""
