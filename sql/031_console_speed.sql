-- The console's pages at a loaded ledger (bench/REPORT.md part 44). Idempotent.
--   wallet_days       a wallet's journal rows of one UTC day and kind, added up once the day
--                     is over (webhooks/billing/wallet_days.py): a statement's opening balance
--                     and its month's figures read these, not every row since the wallet began
--   wallet_days_done  the last day of each wallet that wallet_days holds
CREATE TABLE IF NOT EXISTS wallet_days (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  customer VARCHAR(254) NOT NULL,
  currency VARCHAR(3) NOT NULL,
  day DATE NOT NULL,
  kind VARCHAR(16) NOT NULL,
  amount_minor BIGINT NOT NULL,
  UNIQUE KEY walletday_customer_currency_day_kind (customer, currency, day, kind)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE IF NOT EXISTS wallet_days_done (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  customer VARCHAR(254) NOT NULL,
  currency VARCHAR(3) NOT NULL,
  through_day DATE NOT NULL,
  UNIQUE KEY walletdaysdone_customer_currency (customer, currency)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--   sales (publisher_id, sold_at, id, payout_state, payout) and (publisher_id, returned_at, id,
--                     status, payout_state, payout), in place of (publisher_id, sold_at) and
--                     (publisher_id, returned_at): a publisher's month of payouts added up by
--                     state, and its adjustments, from the index alone (payout_statement.py),
--                     its lines still read in (time, id) order
CREATE INDEX IF NOT EXISTS sale_publisher_month ON sales (publisher_id, sold_at, id, payout_state, payout);
DROP INDEX IF EXISTS sale_publisher_id_sold_at ON sales;
CREATE INDEX IF NOT EXISTS sale_publisher_returns ON sales (publisher_id, returned_at, id, status, payout_state, payout);
DROP INDEX IF EXISTS sale_publisher_id_returned_at ON sales;
--   lead_stats        kept in (hour, publisher_id, buyer_id) order, its primary key (id stays
--                     unique): a report's range of hours is one sequential read of the rows
--                     themselves, where the unique index sent a lookup per row (reports.py)
ALTER TABLE lead_stats
  ADD UNIQUE KEY IF NOT EXISTS leadstats_id (id),
  DROP PRIMARY KEY,
  ADD PRIMARY KEY (hour, publisher_id, buyer_id),
  DROP INDEX IF EXISTS leadstats_hour_publisher_id_buyer_id;
--   sales (buyer_id, lead_id)  a buyer's sales of one lead id (the portal's and the buyer API's
--                     search by lead id): on (buyer_id, sold_at) MariaDB walked every sale of
--                     the buyer for it
CREATE INDEX IF NOT EXISTS sale_buyer_id_lead_id ON sales (buyer_id, lead_id);
