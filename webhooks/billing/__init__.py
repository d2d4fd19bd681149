"""Buyer billing: how a buyer pays (its wallet and floor), the balance Redis holds for its
reservations, the wallets' journal, the wallet moves of sales and returns, monthly statements
and balance events."""
