-- Buyer balances (docs/api.md "Buyer balances"; docs/buyers.md "Balances"): a buyer may pay for
-- its leads from a wallet, drawn in the cap reservation. Idempotent (MariaDB's IF NOT EXISTS).
--   buyers.billing          JSON: mode (prepaid | credit), account, currency, credit_limit,
--                           low_balance; NULL: not billed
--   buyers.billing_account  "<account>|<currency>" of a billed buyer: which buyers a wallet's
--                           change concerns, found by index
--   wallets.version         how many times the wallet moved: Redis takes a figure only with a
--                           newer version, so a late or repeated sync changes nothing
--   leads.charge_minor      what the sale debited from the buyer's wallet (NULL: not billed);
--                           a return credits back exactly this
ALTER TABLE buyers
  ADD COLUMN IF NOT EXISTS billing         TEXT         NULL,
  ADD COLUMN IF NOT EXISTS billing_account VARCHAR(300) NULL;
CREATE INDEX IF NOT EXISTS buyer_billing_account ON buyers (billing_account);

ALTER TABLE wallets
  ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0;

ALTER TABLE leads
  ADD COLUMN IF NOT EXISTS charge_minor BIGINT NULL;
