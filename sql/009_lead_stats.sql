-- The leads report (API.md "Reports"; docs/operations.md "The leads report"): its figures per
-- hour, publisher and buyer, kept in the transaction of each settlement and return
-- (leads/reports.py), so that a month of a busy network is read from a few thousand rows
-- rather than aggregated from millions of leads. Idempotent (IF NOT EXISTS), like every
-- migration; the ledger's leads settled before it are counted in once, here.
CREATE TABLE IF NOT EXISTS lead_stats (
  id           BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
  hour         DATETIME(6)   NOT NULL,
  publisher_id VARCHAR(64)   NOT NULL,
  buyer_id     VARCHAR(64)   NOT NULL,
  leads        INT           NOT NULL DEFAULT 0,
  sold         INT           NOT NULL DEFAULT 0,
  returned     INT           NOT NULL DEFAULT 0,
  revenue      DECIMAL(16,2) NOT NULL DEFAULT 0,
  payout       DECIMAL(16,2) NOT NULL DEFAULT 0,
  UNIQUE KEY leadstats_hour_publisher_id_buyer_id (hour, publisher_id, buyer_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT INTO lead_stats (hour, publisher_id, buyer_id, leads, sold, returned, revenue, payout)
SELECT TIMESTAMP(DATE(received_at), MAKETIME(HOUR(received_at), 0, 0)), publisher_id, COALESCE(buyer_id, ''),
       COUNT(*),
       SUM(status IN ('sold', 'returned')),
       SUM(status = 'returned'),
       SUM(CASE WHEN status = 'sold' THEN price ELSE 0 END),
       SUM(CASE WHEN status = 'sold' THEN COALESCE(commission, 0) ELSE 0 END)
FROM leads
WHERE status IN ('sold', 'unsold', 'returned')
GROUP BY 1, 2, 3
ON DUPLICATE KEY UPDATE leads = lead_stats.leads;
