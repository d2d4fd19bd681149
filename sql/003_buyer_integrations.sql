-- Buyer integrations, duplicate suppression, returns and the routing trace (API.md "Buyer
-- integrations", "dedupe", "Lead returns", "Routing trace"). Idempotent (MariaDB's IF NOT
-- EXISTS), like every migration.

ALTER TABLE buyers
  ADD COLUMN IF NOT EXISTS delivery           TEXT NULL,
  ADD COLUMN IF NOT EXISTS ping               TEXT NULL,
  ADD COLUMN IF NOT EXISTS weight             INT  NOT NULL DEFAULT 1,
  ADD COLUMN IF NOT EXISTS dedupe             TEXT NULL,
  ADD COLUMN IF NOT EXISTS return_window_days INT  NOT NULL DEFAULT 7;

ALTER TABLE publishers
  ADD COLUMN IF NOT EXISTS routing VARCHAR(16) NOT NULL DEFAULT 'waterfall';

ALTER TABLE leads
  ADD COLUMN IF NOT EXISTS skipped       TEXT         NULL,
  ADD COLUMN IF NOT EXISTS returned_at   DATETIME(6)  NULL,
  ADD COLUMN IF NOT EXISTS return_reason VARCHAR(500) NULL;

ALTER TABLE lead_attempts
  ADD COLUMN IF NOT EXISTS bid DECIMAL(12,2) NULL;
