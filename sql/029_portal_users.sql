-- Portal users (docs/api.md "Portals"): a user of role `buyer` is tied to one buyer, a user of
-- role `publisher` to one publisher; an operator user has neither. Idempotent.
--   buyer_id       the buyer a `buyer` user sees and acts for; NULL for any other role
--   publisher_id   the publisher a `publisher` user sees and acts for; NULL for any other role
ALTER TABLE users
  ADD COLUMN IF NOT EXISTS buyer_id VARCHAR(64) NULL,
  ADD COLUMN IF NOT EXISTS publisher_id VARCHAR(64) NULL;
