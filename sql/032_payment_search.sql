-- The console's payments (webhooks/payments/search.py): every payment newest first, a page at a
-- time from a keyset cursor (received_at, id), and a wallet's payments (customer, currency) in
-- the same order. Each read is a range of one of these indexes, however many payments the
-- ledger holds. Idempotent, like every migration (MariaDB's IF NOT EXISTS).
CREATE INDEX IF NOT EXISTS payment_received_at_id ON payments (received_at, id);
CREATE INDEX IF NOT EXISTS payment_customer_currency_received_at_id ON payments (customer, currency, received_at, id);
