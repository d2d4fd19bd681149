-- Earnings-per-lead routing (docs/leads.md "Earnings-per-lead routing"). Idempotent, like every
-- migration.
--   publishers.epl_window_days  the days of history `routing: epl` ranks its buyers by (7: a
--                               week, as the contract's default)
ALTER TABLE publishers ADD COLUMN IF NOT EXISTS epl_window_days INT NOT NULL DEFAULT 7;
