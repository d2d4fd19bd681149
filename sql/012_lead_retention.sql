-- Lead-body retention (API.md "Data kept per lead is bounded"; leads/ledger.py purge_bodies):
-- the purge walks the ledger in (received_at, id) order from where its last run stopped, so
-- each run reads only the leads received since. InnoDB keeps the primary key in every
-- secondary index: this one is that order. Online (no table copy); idempotent, like every
-- migration.
ALTER TABLE leads ADD INDEX IF NOT EXISTS lead_received_at (received_at);
