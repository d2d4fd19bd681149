-- A publisher's caps (API.md "Publishers: limits, quality, test mode and payouts", `caps`):
-- leads accepted per UTC hour and day, counted in Redis with the lead's claim
-- (lua/claim_lead.lua); NULL: unlimited. Idempotent, like every migration.
ALTER TABLE publishers
  ADD COLUMN IF NOT EXISTS cap_hourly INT NULL,
  ADD COLUMN IF NOT EXISTS cap_daily  INT NULL;
