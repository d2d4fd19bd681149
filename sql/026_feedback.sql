-- Buyer feedback, and the leads report's offers (docs/api.md "Feedback and earnings-per-lead
-- routing"). Idempotent, like every migration.
--   feedback             what a buyer said of one of its sales (contacted, qualified, converted,
--                        bad; a value): one row per feedback. The unique key (buyer_id,
--                        feedback_id), the buyer's own id, makes feedback sent twice, or many
--                        times at once, stored once.
--   lead_stats.offers    attempts made to the row's buyer (every outcome but circuit_open and
--                        request_not_built), counted at settlement from the lead's attempts
--   lead_stats.accepted  those of them it accepted
--   lead_stats.conversions  sales of the row whose buyer said `converted` (once per sale)
-- Rows written before this release counted no offers. Rebuilding them from lead_attempts would
-- scan every lead and attempt of the ledger in one statement, under the locks an UPDATE's read
-- takes, while settlements write. Every sale such a row counted came from an accepted offer, so
-- its offers and accepted start as its sales: its hours show an accept rate of 1 and an epl of
-- its average price, upper bounds (the offers its buyer refused are not known without that
-- scan). No buyer sent feedback before: conversions start at 0.
CREATE TABLE IF NOT EXISTS feedback (
  id           BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
  buyer_id     VARCHAR(64)   NOT NULL,
  feedback_id  VARCHAR(64)   NOT NULL,
  sale_id      BIGINT        NOT NULL,
  publisher_id VARCHAR(64)   NOT NULL,
  lead_id      VARCHAR(64)   NOT NULL,
  event        VARCHAR(16)   NOT NULL,
  value        DECIMAL(12,2) NULL,
  created_at   DATETIME(6)   NOT NULL,
  UNIQUE KEY feedback_buyer_id_feedback_id (buyer_id, feedback_id),
  KEY feedback_sale_id (sale_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

ALTER TABLE lead_stats
  ADD COLUMN IF NOT EXISTS offers INT NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS accepted INT NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS conversions INT NOT NULL DEFAULT 0;

UPDATE lead_stats SET offers = COALESCE(sales, sold), accepted = COALESCE(sales, sold)
WHERE offers = 0 AND accepted = 0;
