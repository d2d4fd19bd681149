"""What is particular to each payment provider: its signature scheme, where its notification's
fields live, its API's list of payments (for reconciliation) and Flutterwave's re-check."""
