-- Refunds and the payment events outbox (API.md "Refunds and reversals", "Payment events to
-- your application"; DESIGN.md "Payment lifecycle and the outbox"). Idempotent (MariaDB's IF
-- NOT EXISTS), like every migration.

-- What has been refunded of each payment; `status` grows to hold `partially_refunded`.
ALTER TABLE payments
  ADD COLUMN IF NOT EXISTS refunded_minor BIGINT NOT NULL DEFAULT 0,
  MODIFY COLUMN status VARCHAR(24) NOT NULL;

-- One row per refund or reversal: the UNIQUE key (provider, reference) is what makes a refund
-- debit its wallet at most once, as payments' key does for a credit.
CREATE TABLE IF NOT EXISTS refunds (
  id                BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  provider          VARCHAR(32)  NOT NULL,
  reference         VARCHAR(128) NOT NULL,
  payment_reference VARCHAR(128) NOT NULL,
  amount_minor      BIGINT       NOT NULL,
  currency          VARCHAR(3)   NOT NULL,
  customer          VARCHAR(254) NOT NULL,
  event_type        VARCHAR(64)  NOT NULL,
  received_at       DATETIME(6)  NOT NULL,
  debited_at        DATETIME(6)  NOT NULL,
  UNIQUE KEY refund_provider_reference (provider, reference),
  KEY refund_provider_payment_reference (provider, payment_reference)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The transactional outbox: each wallet change inserts its event here in the same transaction;
-- the worker delivers it to PAYMENT_EVENTS_URL. One event per wallet change (the UNIQUE key),
-- `event_id` is the stable `webhook-id`.
CREATE TABLE IF NOT EXISTS payment_events (
  id               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  event_id         VARCHAR(64)  NOT NULL,
  type             VARCHAR(32)  NOT NULL,
  provider         VARCHAR(32)  NOT NULL,
  reference        VARCHAR(128) NOT NULL,
  customer         VARCHAR(254) NOT NULL,
  body             TEXT         NOT NULL,
  status           VARCHAR(16)  NOT NULL,
  attempts         INT          NOT NULL DEFAULT 0,
  created_at       DATETIME(6)  NOT NULL,
  next_attempt_at  DATETIME(6)  NOT NULL,
  first_attempt_at DATETIME(6)  NULL,
  last_attempt_at  DATETIME(6)  NULL,
  delivered_at     DATETIME(6)  NULL,
  last_error       VARCHAR(500) NULL,
  UNIQUE KEY paymentevent_event_id (event_id),
  UNIQUE KEY paymentevent_provider_type_reference (provider, type, reference),
  KEY paymentevent_status_customer_id (status, customer, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
