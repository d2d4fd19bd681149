"""Lead routing under caps: intake, buyer and publisher rules, the per-process catalog,
routing, delivery, settlement to the ledger."""
