-- The console's pages at a loaded ledger (bench/REPORT.md part 44). Idempotent.
--   audit_log (entity, id)  the newest rows of one kind (/ops/audit?entity=, the returns
--                           queue's decisions): a backward walk of this index, where the
--                           (entity, entity_id) one made MariaDB sort every row of the kind
CREATE INDEX IF NOT EXISTS auditlog_entity_id ON audit_log (entity, id);
