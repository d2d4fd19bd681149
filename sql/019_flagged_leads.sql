-- Leads flagged for review (leads/accounting/ledger.py `flagged`: the /ops page every few
-- seconds, `floodgate leads flagged`) are those with an attempt whose outcome is `unknown`.
-- Without an index on the outcome every read of them scanned the whole of lead_attempts; with
-- it, the few flagged attempts are found in the index and their leads by the unique key.
-- Online (no table copy); idempotent, like every migration (MariaDB's IF NOT EXISTS).
ALTER TABLE lead_attempts ADD INDEX IF NOT EXISTS leadattempt_outcome (outcome);
