-- A lead's sales as records of their own (docs/leads.md "Sales and returns"), and buyers'
-- return policies. Idempotent, like every migration (IF NOT EXISTS; the copy skips a sale that
-- is there already).
--   sales          one row per sale of a lead: its buyer, price, the publisher's payout, its
--                  status (sold | return_pending | returned), its return, the billing charge
--                  and the cap lease it was sold under. No buyer buys one lead twice: the
--                  unique key (publisher_id, lead_id, buyer_id), which also makes a settlement
--                  written twice write each sale once.
--   lead_returns   one row per return asked for a sale: pending (manual review), approved
--                  (an automatic return is approved when made) or rejected, who decided, when
--   buyers.return_policy  JSON: max_pct, period_days, reasons, review (the window stays in
--                  return_window_days); NULL: the defaults (any reason, no limit, automatic)
CREATE TABLE IF NOT EXISTS sales (
  id             BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
  publisher_id   VARCHAR(64)   NOT NULL,
  lead_id        VARCHAR(64)   NOT NULL,
  buyer_id       VARCHAR(64)   NOT NULL,
  price          DECIMAL(12,2) NOT NULL,
  payout         DECIMAL(12,2) NULL,
  status         VARCHAR(16)   NOT NULL,
  sold_at        DATETIME(6)   NOT NULL,
  returned_at    DATETIME(6)   NULL,
  return_reason  VARCHAR(500)  NULL,
  charge_minor   BIGINT        NULL,
  charge_account VARCHAR(300)  NULL,
  lease_id       VARCHAR(32)   NULL,
  reserved_us    BIGINT        NULL,
  UNIQUE KEY sale_publisher_id_lead_id_buyer_id (publisher_id, lead_id, buyer_id),
  KEY sale_buyer_id_sold_at (buyer_id, sold_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS lead_returns (
  id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  return_id    VARCHAR(32)  NOT NULL,
  sale_id      BIGINT       NOT NULL,
  publisher_id VARCHAR(64)  NOT NULL,
  lead_id      VARCHAR(64)  NOT NULL,
  buyer_id     VARCHAR(64)  NOT NULL,
  reason       VARCHAR(500) NULL,
  status       VARCHAR(16)  NOT NULL,
  requested_at DATETIME(6)  NOT NULL,
  decided_at   DATETIME(6)  NULL,
  actor        VARCHAR(64)  NULL,
  UNIQUE KEY leadreturn_return_id (return_id),
  KEY leadreturn_sale_id (sale_id),
  KEY leadreturn_status_requested_at (status, requested_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

ALTER TABLE buyers ADD COLUMN IF NOT EXISTS return_policy TEXT NULL;

-- Every lead sold or returned before this release becomes its one sale, with the columns the
-- lead row held for it. One statement; a lead whose sale exists already is skipped (run twice:
-- no duplicate). Portable SQL: upgrade() runs it on SQLite too.
INSERT INTO sales (publisher_id, lead_id, buyer_id, price, payout, status, sold_at, returned_at,
                   return_reason, charge_minor, charge_account, lease_id, reserved_us)
  SELECT l.publisher_id, l.lead_id, l.buyer_id, COALESCE(l.price, 0), l.commission, l.status,
         COALESCE(l.sold_at, l.settled_at), l.returned_at, l.return_reason, l.charge_minor,
         l.charge_account, l.lease_id, l.reserved_us
  FROM leads l
  WHERE l.status IN ('sold', 'returned') AND l.buyer_id IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM sales s
                    WHERE s.publisher_id = l.publisher_id AND s.lead_id = l.lead_id AND s.buyer_id = l.buyer_id);
