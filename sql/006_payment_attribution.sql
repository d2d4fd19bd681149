-- Payments as providers send them (API.md "Payment attribution and recovery"; docs/payments.md
-- "Which wallet a payment credits"). Idempotent (MariaDB's IF NOT EXISTS), like every migration.
--   customer    the wallet credited: the merchant's account id from metadata, else the payer's
--               e-mail; '' while the payment is `unattributed` (until an assign names it)
--   payer       the payer's e-mail as the provider sent it (a refund's payer is checked against it)
--   fees_minor  the fee the provider passed on to the payer (credited: the amount requested)
--   flag        why the payment needs a look: partially_paid, overpaid (Monnify)
--   source      webhook, or reconciliation (found by listing the provider's payments)
--   assigned_at when an operator's assign credited an unattributed payment
ALTER TABLE payments
  ADD COLUMN IF NOT EXISTS payer       VARCHAR(254) NULL,
  ADD COLUMN IF NOT EXISTS fees_minor  BIGINT       NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS flag        VARCHAR(32)  NULL,
  ADD COLUMN IF NOT EXISTS source      VARCHAR(16)  NOT NULL DEFAULT 'webhook',
  ADD COLUMN IF NOT EXISTS assigned_at DATETIME(6)  NULL;

-- GET /v1/admin/payments?status=unattributed lists them oldest first
CREATE INDEX IF NOT EXISTS payment_status_received_at ON payments (status, received_at);
