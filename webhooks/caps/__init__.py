"""Buyer caps in Redis: calendar windows, leases reserved and finished by Lua scripts, the
circuit breaker, and the rebuild and reconciliation of counters from the ledger."""
