-- A delivery that fails its signature check keeps no body or headers, only metadata: its
-- length and SHA-256 (kept for every delivery from now on). Idempotent (MariaDB's IF NOT
-- EXISTS), like every migration.

ALTER TABLE webhook_deliveries
  ADD COLUMN IF NOT EXISTS body_length INT         NULL,
  ADD COLUMN IF NOT EXISTS body_sha256 VARCHAR(64) NULL;
