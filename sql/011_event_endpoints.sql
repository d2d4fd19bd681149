-- Event endpoints (API.md "Event endpoints"; DESIGN.md "Events"): one outbox for every event
-- type and one delivery engine for every endpoint. Idempotent (IF NOT EXISTS, INSERT IGNORE),
-- like every migration.

-- The applications' endpoints. The one PAYMENT_EVENTS_URL configures is the row
-- 'payment-events-url' (secret NULL: PAYMENT_EVENTS_SECRET signs), kept in step by the worker.
CREATE TABLE IF NOT EXISTS event_endpoints (
  id              VARCHAR(64)   NOT NULL PRIMARY KEY,
  url             VARCHAR(2048) NOT NULL,
  types           TEXT          NULL,
  publisher_id    VARCHAR(64)   NULL,
  secret          VARCHAR(200)  NULL,
  enabled         TINYINT(1)    NOT NULL DEFAULT 1,
  disabled_reason VARCHAR(16)   NULL,
  disabled_at     DATETIME(6)   NULL,
  failing_since   DATETIME(6)   NULL,
  last_error      VARCHAR(500)  NULL,
  last_attempt_at DATETIME(6)   NULL,
  last_success_at DATETIME(6)   NULL,
  created_at      DATETIME(6)   NOT NULL,
  updated_at      DATETIME(6)   NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The outbox: each announced change inserts its event in its own transaction; one per change
-- (the UNIQUE key). The worker fans each out into event_deliveries, then sets fanned_out.
CREATE TABLE IF NOT EXISTS events (
  id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  event_id     VARCHAR(64)  NOT NULL,
  type         VARCHAR(32)  NOT NULL,
  subject      VARCHAR(200) NOT NULL,
  entity       VARCHAR(254) NOT NULL,
  publisher_id VARCHAR(64)  NULL,
  body         TEXT         NOT NULL,
  created_at   DATETIME(6)  NOT NULL,
  fanned_out   TINYINT(1)   NOT NULL DEFAULT 0,
  UNIQUE KEY event_event_id (event_id),
  UNIQUE KEY event_type_subject (type, subject),
  KEY event_fanned_out_id (fanned_out, id),
  KEY event_created_at (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One event to one endpoint: its stable webhook-id, its state, its retries.
CREATE TABLE IF NOT EXISTS event_deliveries (
  id               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  event_id         BIGINT       NOT NULL,
  endpoint_id      VARCHAR(64)  NOT NULL,
  entity           VARCHAR(254) NOT NULL,
  webhook_id       VARCHAR(64)  NOT NULL,
  status           VARCHAR(16)  NOT NULL,
  attempts         INT          NOT NULL DEFAULT 0,
  created_at       DATETIME(6)  NOT NULL,
  next_attempt_at  DATETIME(6)  NOT NULL,
  first_attempt_at DATETIME(6)  NULL,
  last_attempt_at  DATETIME(6)  NULL,
  delivered_at     DATETIME(6)  NULL,
  last_error       VARCHAR(500) NULL,
  UNIQUE KEY eventdelivery_event_id_endpoint_id (event_id, endpoint_id),
  KEY eventdelivery_endpoint_id_status_next_attempt_at (endpoint_id, status, next_attempt_at),
  KEY eventdelivery_entity_endpoint_id_status_id (entity, endpoint_id, status, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The delivery log: every attempt and what the endpoint answered.
CREATE TABLE IF NOT EXISTS event_attempts (
  id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  delivery_id BIGINT       NOT NULL,
  at          DATETIME(6)  NOT NULL,
  status_code SMALLINT     NULL,
  error       VARCHAR(500) NULL,
  ms          INT          NOT NULL,
  KEY eventattempt_delivery_id_id (delivery_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The payment events outbox of sql/004 carried over: its events keep their ids (the webhook-id
-- PAYMENT_EVENTS_URL knows them by) and their state, now as deliveries to the endpoint
-- 'payment-events-url' (its url set by the worker from PAYMENT_EVENTS_URL). payment_events is
-- left as it was and no longer written.
INSERT IGNORE INTO events (event_id, type, subject, entity, publisher_id, body, created_at, fanned_out)
SELECT event_id, type, CONCAT(provider, ':', reference), customer, NULL, body, created_at, 1
FROM payment_events ORDER BY id;

INSERT IGNORE INTO event_endpoints (id, url, types, secret, enabled, created_at, updated_at)
SELECT 'payment-events-url', '', '["wallet.credited","wallet.debited"]', NULL, 1, NOW(6), NOW(6)
FROM DUAL WHERE EXISTS (SELECT 1 FROM payment_events);

INSERT IGNORE INTO event_deliveries (event_id, endpoint_id, entity, webhook_id, status, attempts, created_at,
                                     next_attempt_at, first_attempt_at, last_attempt_at, delivered_at, last_error)
SELECT e.id, 'payment-events-url', p.customer, p.event_id, p.status, p.attempts, p.created_at,
       p.next_attempt_at, p.first_attempt_at, p.last_attempt_at, p.delivered_at, p.last_error
FROM payment_events p JOIN events e ON e.event_id = p.event_id ORDER BY p.id;
