-- Disputes, refunds on every API version, and why a webhook was ignored (API.md "Disputes,
-- refunds on every API version, and what providers take back"; docs/payments.md "Money going
-- back"). Idempotent (MariaDB's IF NOT EXISTS), like every migration.
--   payments.disputed_minor        what disputes hold withdrawn now (status `disputed` while > 0)
--   payments.refund_unnamed_minor  what Stripe's charge.refunded debited that no refund id has
--                                  claimed yet (a later refund.* event of it debits only the rest)
--   refunds.status                 debited, or reversed (failed or canceled after: credited back)
--   refunds.debited_minor          what of the refund the wallet counts (below amount_minor when the
--                                  refund includes a fee the payer paid on top)
--   refunds.flag                   refund_includes_fee
--   webhook_deliveries.reason      why an `ignored` delivery moved nothing
ALTER TABLE payments
  ADD COLUMN IF NOT EXISTS disputed_minor       BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS refund_unnamed_minor BIGINT NOT NULL DEFAULT 0;

ALTER TABLE refunds
  ADD COLUMN IF NOT EXISTS status        VARCHAR(16) NOT NULL DEFAULT 'debited',
  ADD COLUMN IF NOT EXISTS debited_minor BIGINT      NULL,
  ADD COLUMN IF NOT EXISTS flag          VARCHAR(32) NULL,
  ADD COLUMN IF NOT EXISTS reversed_at   DATETIME(6) NULL;

ALTER TABLE webhook_deliveries
  ADD COLUMN IF NOT EXISTS reason VARCHAR(32) NULL;

-- GET /v1/admin/webhooks/ignored counts the ignored deliveries of a window per provider and type
CREATE INDEX IF NOT EXISTS webhookdelivery_verdict_received_at ON webhook_deliveries (verdict, received_at);

-- One row per dispute (chargeback): the UNIQUE key (provider, reference) is the provider's dispute
-- id, so a dispute's money leaves the wallet at most once, and comes back at most once.
CREATE TABLE IF NOT EXISTS payment_disputes (
  id                BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  provider          VARCHAR(32)  NOT NULL,
  reference         VARCHAR(128) NOT NULL,
  payment_reference VARCHAR(128) NOT NULL,
  amount_minor      BIGINT       NOT NULL,
  currency          VARCHAR(3)   NOT NULL,
  customer          VARCHAR(254) NOT NULL,
  status            VARCHAR(16)  NOT NULL,
  event_type        VARCHAR(64)  NOT NULL,
  received_at       DATETIME(6)  NOT NULL,
  withdrawn_at      DATETIME(6)  NULL,
  reinstated_at     DATETIME(6)  NULL,
  UNIQUE KEY paymentdispute_provider_reference (provider, reference),
  KEY paymentdispute_provider_payment_reference (provider, payment_reference)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
