-- Shared leads (docs/leads.md "Shared leads"): one lead sold to several buyers. Idempotent,
-- like every migration.
--   publishers.max_sales  how many buyers one of its leads may be sold to (1: exclusive, as
--                         before this release)
--   buyers.contract       exclusive (offered first, buys the lead alone) | shared (buys it
--                         beside others, up to the publisher's max_sales)
--   lead_stats.sales      the sales counted in the report's row: a shared lead is one lead
--                         (`leads`, `sold`, in its first buyer's row) and several sales (each
--                         in its buyer's row). Every row written before this release counted
--                         one sale per sold lead: `sales` starts as `sold`.
ALTER TABLE publishers ADD COLUMN IF NOT EXISTS max_sales INT NOT NULL DEFAULT 1;
ALTER TABLE buyers ADD COLUMN IF NOT EXISTS contract VARCHAR(16) NOT NULL DEFAULT 'exclusive';
ALTER TABLE lead_stats ADD COLUMN IF NOT EXISTS sales INT NULL;
UPDATE lead_stats SET sales = sold WHERE sales IS NULL;
