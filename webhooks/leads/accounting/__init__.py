"""What a sold lead leaves in the ledger: settlement writes, returns, reports."""
