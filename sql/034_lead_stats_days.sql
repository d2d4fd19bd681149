-- The leads report of whole days (docs/operations.md "The leads report"). Idempotent.
--   lead_stats_days  lead_stats added up per UTC day, publisher and buyer, kept in the same
--                    transactions (leads/accounting/reports.py): a report by day, publisher or
--                    buyer reads a row per day where lead_stats has 24 (a month at 20
--                    publishers x 18 buyers: 10,800 rows, not 259,000); by hour still reads
--                    lead_stats. In (day, publisher_id, buyer_id) order, its primary key, as
--                    lead_stats' (sql/031); (buyer_id, day) for a buyer's page (sql/033)
CREATE TABLE IF NOT EXISTS lead_stats_days (
  id           BIGINT        NOT NULL AUTO_INCREMENT,
  day          DATE          NOT NULL,
  publisher_id VARCHAR(64)   NOT NULL,
  buyer_id     VARCHAR(64)   NOT NULL,
  leads        INT           NOT NULL DEFAULT 0,
  sold         INT           NOT NULL DEFAULT 0,
  returned     INT           NOT NULL DEFAULT 0,
  revenue      DECIMAL(16,2) NOT NULL DEFAULT 0,
  payout       DECIMAL(16,2) NOT NULL DEFAULT 0,
  sales        INT           NOT NULL DEFAULT 0,
  offers       INT           NOT NULL DEFAULT 0,
  accepted     INT           NOT NULL DEFAULT 0,
  conversions  INT           NOT NULL DEFAULT 0,
  PRIMARY KEY (day, publisher_id, buyer_id),
  UNIQUE KEY leadstatsdays_id (id),
  KEY leadstatsdays_buyer_id_day (buyer_id, day)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- The days of the hours counted before it, once (portable: SQLite runs it too, migrate.py)
INSERT INTO lead_stats_days (day, publisher_id, buyer_id, leads, sold, returned, revenue, payout,
  sales, offers, accepted, conversions)
SELECT DATE(hour), publisher_id, buyer_id, SUM(leads), SUM(sold), SUM(returned), SUM(revenue),
  SUM(payout), SUM(COALESCE(sales, 0)), SUM(offers), SUM(accepted), SUM(conversions)
FROM lead_stats
WHERE NOT EXISTS (SELECT 1 FROM lead_stats_days)
GROUP BY DATE(hour), publisher_id, buyer_id;
