-- The lead lookup by e-mail or phone (GET /v1/admin/leads?q=, the console's search box): each
-- lead's consumer keys (webhooks/formats/consumer.py, the normaliser of dedupe and suppression)
-- kept as keyed digests, never the address or number itself, written with the lead by the
-- ledger and emptied with its body (erasure, retention). Idempotent, like every migration.
--   email_digest   hex of HMAC-SHA256 under SUPPRESSION_KEY of the e-mail key's SHA-256 prefix
--                  (a plain suppression list's entry for it); NULL when the lead has none
--   phone_digest   the same of its phone key (E.164)
-- Columns added at the end, NULL: MariaDB adds them instantly; the indexes are built online,
-- in minutes on a ledger of millions of leads (on Galera, writes to the table wait for them:
-- docs/cluster.md "Migrations"). `flask --app wsgi leads index` then fills the leads before it.
ALTER TABLE leads
  ADD COLUMN IF NOT EXISTS email_digest VARCHAR(32) NULL,
  ADD COLUMN IF NOT EXISTS phone_digest VARCHAR(32) NULL;
ALTER TABLE leads ADD INDEX IF NOT EXISTS lead_email_digest (email_digest);
ALTER TABLE leads ADD INDEX IF NOT EXISTS lead_phone_digest (phone_digest);
