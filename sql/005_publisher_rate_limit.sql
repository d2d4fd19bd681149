-- A publisher's own rate limit (API.md "Publishers: limits, quality, test mode and payouts",
-- `rate_limit`): a token bucket of `rate_burst` leads refilled at `rate_per_second`. NULL
-- (both): the PUBLISHER_RATE_LIMIT default applies. Idempotent (MariaDB's IF NOT EXISTS),
-- like every migration.

ALTER TABLE publishers
  ADD COLUMN IF NOT EXISTS rate_per_second INT NULL,
  ADD COLUMN IF NOT EXISTS rate_burst      INT NULL;
