-- Operator users (docs/api.md "Operator users"): who logs in on /ops by e-mail and password.
-- Idempotent, like every migration.
--   email              the login, lower-cased; unique
--   role               owner | admin | analyst
--   password_hash      argon2id (PHC string, `$argon2id$...`); NULL until the set-up link is used
--   totp_secret        base32 TOTP secret of an owner or admin (made with the invitation, shown
--                      on the set-up page); NULL for an analyst
--   setup_digest       SHA-256 of the one-time set-up token (never the token); NULL once used
--   setup_expires_at   when the set-up link stops working
--   active             0: deactivated, no login and no session works
CREATE TABLE IF NOT EXISTS users (
  id                BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
  email             VARCHAR(254)  NOT NULL,
  role              VARCHAR(16)   NOT NULL,
  password_hash     VARCHAR(255)  NULL,
  totp_secret       VARCHAR(64)   NULL,
  setup_digest      VARCHAR(64)   NULL,
  setup_expires_at  DATETIME(6)   NULL,
  active            TINYINT(1)    NOT NULL DEFAULT 1,
  created_at        DATETIME(6)   NOT NULL,
  updated_at        DATETIME(6)   NOT NULL,
  UNIQUE KEY users_email (email),
  UNIQUE KEY users_setup_digest (setup_digest)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
