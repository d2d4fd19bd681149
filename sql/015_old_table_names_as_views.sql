-- The names sql/014 retired, kept as views for one release, so that a deploy has no window of
-- failures: processes of the release before 014 keep reading and writing `webhook_deliveries`
-- and `event_deliveries` (a view over one whole table is updatable and insertable, INSERT ...
-- ON DUPLICATE KEY UPDATE included) until they are replaced. The release after this one drops
-- them. MySQL/MariaDB only: the SQLite ledger of development has one release at a time.
CREATE OR REPLACE VIEW webhook_deliveries AS SELECT * FROM webhook_calls;
CREATE OR REPLACE VIEW event_deliveries AS SELECT * FROM event_dispatches;
