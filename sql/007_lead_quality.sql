-- Lead quality (API.md "Publishers: limits, quality, test mode and payouts" `fields`, and
-- "Buyer `filter`"; docs/leads.md "Lead quality"). Idempotent (MariaDB's IF NOT EXISTS), like
-- every migration.

-- The publisher's lead spec as JSON (leads/quality.py); NULL: leads are not checked
-- and its mode: live, or test (every lead of it a test lead: routed by reads only)
ALTER TABLE publishers
  ADD COLUMN IF NOT EXISTS fields_spec TEXT NULL,
  ADD COLUMN IF NOT EXISTS mode        VARCHAR(8) NOT NULL DEFAULT 'live';

-- The buyer's JMESPath filter on the normalised lead; NULL: no filter
ALTER TABLE buyers
  ADD COLUMN IF NOT EXISTS lead_filter TEXT NULL;
