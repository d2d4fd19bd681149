-- A publisher's payout rule (API.md "Publishers: limits, quality, test mode and payouts",
-- `payout`): a fixed amount per sold lead; NULL: `commission_pct` of the sale price, as before.
-- Each sale keeps what it paid in leads.commission. Idempotent, like every migration.
ALTER TABLE publishers
  ADD COLUMN IF NOT EXISTS payout_fixed DECIMAL(12,2) NULL;
