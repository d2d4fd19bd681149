-- Publisher payout holds (docs/leads.md "Payout holds"). Idempotent, like every migration.
--   publishers.payout_hold_days  days a sale's payout is held before it is payable (0: at once)
--   publishers.payout_held       the sum of its payouts held now; `balance` is what is payable
--   sales.payout_state           held | payable | cancelled (returned while held: never payable)
--   sales.payable_at             when the sale's hold ends (NULL: sold before this release, no hold)
-- Every sale written before this release was credited to its publisher's balance when it was
-- sold, so it is `payable` (the column's default: an instant ADD COLUMN, no rows rewritten); a
-- sale returned before it had its payout taken back from the balance, which is what a return
-- after the payout was payable does: an adjustment in the month of its return.
ALTER TABLE publishers
  ADD COLUMN IF NOT EXISTS payout_hold_days INT NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS payout_held DECIMAL(14,2) NOT NULL DEFAULT 0;

ALTER TABLE sales
  ADD COLUMN IF NOT EXISTS payout_state VARCHAR(16) NOT NULL DEFAULT 'payable',
  ADD COLUMN IF NOT EXISTS payable_at DATETIME(6) NULL;

-- The release job's due payouts; a publisher's statement: its sales of a month, its returns of one.
CREATE INDEX IF NOT EXISTS sale_payout_state_payable_at ON sales (payout_state, payable_at);
CREATE INDEX IF NOT EXISTS sale_publisher_id_sold_at ON sales (publisher_id, sold_at);
CREATE INDEX IF NOT EXISTS sale_publisher_id_returned_at ON sales (publisher_id, returned_at);
