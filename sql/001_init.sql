-- Floodgate ledger, MySQL/MariaDB (InnoDB, utf8mb4). Applied by `flask --app wsgi db upgrade`.
-- The unique keys below carry the invariants: one lead per (publisher, lead_id), one payment
-- per (provider, reference), one wallet balance per (customer, currency).

CREATE TABLE IF NOT EXISTS publishers (
  id             VARCHAR(64)   NOT NULL PRIMARY KEY,
  name           VARCHAR(200)  NOT NULL,
  api_key_hash   VARCHAR(64)   NOT NULL,
  api_key_hint   VARCHAR(8)    NOT NULL,
  commission_pct DECIMAL(5,2)  NOT NULL,
  active         TINYINT(1)    NOT NULL DEFAULT 1,
  balance        DECIMAL(14,2) NOT NULL DEFAULT 0,
  created_at     DATETIME(6)   NOT NULL,
  updated_at     DATETIME(6)   NOT NULL,
  UNIQUE KEY publishers_api_key_hash (api_key_hash)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS buyers (
  id                 VARCHAR(64)   NOT NULL PRIMARY KEY,
  name               VARCHAR(200)  NOT NULL,
  endpoint_url       VARCHAR(2048) NOT NULL,
  priority           INT           NOT NULL,
  price              DECIMAL(12,2) NOT NULL,
  timezone           VARCHAR(64)   NOT NULL,
  cap_hourly         INT           NULL,
  cap_daily          INT           NULL,
  cap_weekly         INT           NULL,
  cap_monthly        INT           NULL,
  cap_daily_budget   DECIMAL(12,2) NULL,
  states             TEXT          NOT NULL,
  blocked_publishers TEXT          NOT NULL,
  schedule           TEXT          NULL,
  active             TINYINT(1)    NOT NULL DEFAULT 1,
  deleted_at         DATETIME(6)   NULL,
  created_at         DATETIME(6)   NOT NULL,
  updated_at         DATETIME(6)   NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS leads (
  id           BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
  publisher_id VARCHAR(64)   NOT NULL,
  lead_id      VARCHAR(64)   NOT NULL,
  status       VARCHAR(16)   NOT NULL,
  buyer_id     VARCHAR(64)   NULL,
  price        DECIMAL(12,2) NULL,
  commission   DECIMAL(12,2) NULL,
  payload      MEDIUMTEXT    NOT NULL,
  received_at  DATETIME(6)   NOT NULL,
  sold_at      DATETIME(6)   NULL,
  settled_at   DATETIME(6)   NOT NULL,
  request_id   VARCHAR(64)   NULL,
  lease_id     VARCHAR(32)   NULL,
  reserved_us  BIGINT        NULL,
  UNIQUE KEY lead_publisher_id_lead_id (publisher_id, lead_id),
  KEY lead_buyer_id_sold_at (buyer_id, sold_at),
  KEY lead_lead_id (lead_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS lead_attempts (
  id           BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
  publisher_id VARCHAR(64) NOT NULL,
  lead_id      VARCHAR(64) NOT NULL,
  seq          SMALLINT    NOT NULL,
  buyer_id     VARCHAR(64) NOT NULL,
  outcome      VARCHAR(16) NOT NULL,
  ms           INT         NOT NULL,
  UNIQUE KEY leadattempt_publisher_id_lead_id_seq (publisher_id, lead_id, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS payments (
  id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  provider     VARCHAR(32)  NOT NULL,
  reference    VARCHAR(128) NOT NULL,
  amount_minor BIGINT       NOT NULL,
  currency     VARCHAR(3)   NOT NULL,
  customer     VARCHAR(254) NOT NULL,
  status       VARCHAR(16)  NOT NULL,
  event_type   VARCHAR(64)  NOT NULL,
  received_at  DATETIME(6)  NOT NULL,
  credited_at  DATETIME(6)  NULL,
  UNIQUE KEY payment_provider_reference (provider, reference)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS wallets (
  id            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  customer      VARCHAR(254) NOT NULL,
  currency      VARCHAR(3)   NOT NULL,
  balance_minor BIGINT       NOT NULL DEFAULT 0,
  updated_at    DATETIME(6)  NOT NULL,
  UNIQUE KEY wallet_customer_currency (customer, currency)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS webhook_deliveries (
  id             BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  provider       VARCHAR(32)  NOT NULL,
  reference      VARCHAR(128) NULL,
  event_type     VARCHAR(64)  NULL,
  verdict        VARCHAR(32)  NOT NULL,
  status_code    SMALLINT     NOT NULL,
  headers        TEXT         NOT NULL,
  body           MEDIUMBLOB   NOT NULL,
  body_truncated TINYINT(1)   NOT NULL DEFAULT 0,
  received_at    DATETIME(6)  NOT NULL,
  KEY webhookdelivery_provider_reference (provider, reference)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS audit_log (
  id        BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  at        DATETIME(6)  NOT NULL,
  actor     VARCHAR(64)  NOT NULL,
  action    VARCHAR(64)  NOT NULL,
  entity    VARCHAR(32)  NOT NULL,
  entity_id VARCHAR(200) NOT NULL,
  detail    TEXT         NULL,
  KEY auditlog_entity_entity_id (entity, entity_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
