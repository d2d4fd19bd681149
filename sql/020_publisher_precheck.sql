-- A publisher's pre-ping quota (docs/api.md "Fifth round: the seams", `precheck`): at most
-- daily_floor + per_lead x the leads it posted in the last 24 hours, counted in Redis
-- (lua/take_precheck.lua); NULL: the defaults (10 and 1000). Idempotent, like every migration.
ALTER TABLE publishers
  ADD COLUMN IF NOT EXISTS precheck_per_lead    INT NULL,
  ADD COLUMN IF NOT EXISTS precheck_daily_floor INT NULL;
