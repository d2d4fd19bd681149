-- Buyer API keys (docs/buyers.md "The buyer API"): a buyer reads its own sales and returns them
-- with a key of its own. Idempotent, like every migration (IF NOT EXISTS).
--   buyers.api_key_hash   SHA-256 (hex) of the buyer's current key, never the key itself; NULL:
--                         no key issued (or the buyer deleted). Unique: a presented key is
--                         found by this index, no buyer is read that does not hold it.
--   sales (buyer_id, status, sold_at)  a buyer's sales of one status, newest first, a page
--                         from the index alone (GET /v1/buyer/leads?status=)
--   audit_log.actor,      widened from 64 to 80 characters: a buyer acting with its key is
--   lead_returns.actor    `buyer:<id>`, and an id has up to 64
ALTER TABLE buyers ADD COLUMN IF NOT EXISTS api_key_hash VARCHAR(64) NULL;
CREATE UNIQUE INDEX IF NOT EXISTS buyer_api_key_hash ON buyers (api_key_hash);

CREATE INDEX IF NOT EXISTS sale_buyer_id_status_sold_at ON sales (buyer_id, status, sold_at);

ALTER TABLE audit_log MODIFY COLUMN actor VARCHAR(80) NOT NULL;

ALTER TABLE lead_returns MODIFY COLUMN actor VARCHAR(80) NULL;
