-- Buyer balances (docs/api.md "Buyer balances"; docs/buyers.md "Balances"): a buyer may pay for
-- its leads from a wallet, drawn in the cap reservation. Idempotent (MariaDB's IF NOT EXISTS).
--   buyers.billing          JSON: mode (prepaid | credit), account, currency, credit_limit,
--                           low_balance; NULL: not billed
--   buyers.billing_account  "<account>|<currency>" of a billed buyer: which buyers a wallet's
--                           change concerns, found by index
--   wallets.version         how many times the wallet moved: Redis takes a figure only with a
--                           newer version, so a late or repeated sync changes nothing
--   leads.charge_minor      what the sale debited from the buyer's wallet (NULL: not billed),
--   leads.charge_account    and which wallet ("<account>|<currency>"): a return credits back
--                           exactly this
ALTER TABLE buyers
  ADD COLUMN IF NOT EXISTS billing         TEXT         NULL,
  ADD COLUMN IF NOT EXISTS billing_account VARCHAR(300) NULL;
CREATE INDEX IF NOT EXISTS buyer_billing_account ON buyers (billing_account);

ALTER TABLE wallets
  ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0;

ALTER TABLE leads
  ADD COLUMN IF NOT EXISTS charge_minor BIGINT NULL;

ALTER TABLE leads
  ADD COLUMN IF NOT EXISTS charge_account VARCHAR(300) NULL;

-- The wallets' journal: one row per move, written in the move's transaction (top_up, sale,
-- return, refund, dispute; amount signed), so a statement is a read of rows that add up to
-- the wallet. A wallet older than this migration starts with one `carried` row of its balance.
CREATE TABLE IF NOT EXISTS wallet_entries (
  id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  customer     VARCHAR(254) NOT NULL,
  currency     VARCHAR(3)   NOT NULL,
  kind         VARCHAR(16)  NOT NULL,
  amount_minor BIGINT       NOT NULL,
  reference    VARCHAR(300) NOT NULL,
  at           DATETIME(6)  NOT NULL,
  INDEX walletentry_customer_currency_at (customer, currency, at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT INTO wallet_entries (customer, currency, kind, amount_minor, reference, at)
  SELECT w.customer, w.currency, 'carried', w.balance_minor, 'sql/016', UTC_TIMESTAMP(6)
  FROM wallets w
  WHERE w.balance_minor <> 0
    AND NOT EXISTS (SELECT 1 FROM wallet_entries e WHERE e.customer = w.customer AND e.currency = w.currency);
