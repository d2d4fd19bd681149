-- Compliance at intake (docs/api.md "Consent, suppression and pre-ping"; docs/leads.md
-- "Suppression lists" and "Consent certificates"). Idempotent (MariaDB's IF NOT EXISTS).
--   suppression_lists    a list: the lead field it holds (email | phone), how its entries are
--                        hashed (md5 | sha256 | none) and how many it holds
--   suppression_entries  its entries as the digests Redis holds (hex; a plain list's values are
--                        hashed here too, so the database keeps no plain e-mail or phone): the
--                        source Redis is rebuilt from after a data loss
--   buyers.suppress, publishers.suppress  JSON lists of list ids
--   buyers.require_consent                JSON list: "trustedform", "jornaya"
--   leads.consent                         JSON: the consent claims made for the lead, with outcome
CREATE TABLE IF NOT EXISTS suppression_lists (
  id         VARCHAR(64) NOT NULL PRIMARY KEY,
  field      VARCHAR(16) NOT NULL,
  hash       VARCHAR(8)  NOT NULL,
  size       BIGINT      NOT NULL,
  created_at DATETIME(6) NOT NULL,
  updated_at DATETIME(6) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS suppression_entries (
  id      BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
  list_id VARCHAR(64) NOT NULL,
  digest  VARCHAR(64) NOT NULL,
  UNIQUE KEY suppressionentry_list_id_digest (list_id, digest)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

ALTER TABLE buyers
  ADD COLUMN IF NOT EXISTS suppress        TEXT NULL,
  ADD COLUMN IF NOT EXISTS require_consent TEXT NULL;

ALTER TABLE publishers
  ADD COLUMN IF NOT EXISTS suppress TEXT NULL;

ALTER TABLE leads
  ADD COLUMN IF NOT EXISTS consent TEXT NULL;
