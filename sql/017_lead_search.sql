-- The lead search (GET /v1/admin/leads, leads/accounting/search.py): newest first, filtered by
-- publisher, buyer or status, a page at a time from a keyset cursor (received_at, id). Each
-- filter gets an index that ends in the sort key, so a page reads `limit` entries of one index
-- from the cursor on, at any depth; a search without a filter (or by time alone) walks
-- lead_received_at (sql/012), which InnoDB extends with the primary key: (received_at, id).
-- Online (no table copy); idempotent, like every migration (MariaDB's IF NOT EXISTS).
ALTER TABLE leads ADD INDEX IF NOT EXISTS lead_publisher_id_received_at_id (publisher_id, received_at, id);
ALTER TABLE leads ADD INDEX IF NOT EXISTS lead_buyer_id_received_at_id (buyer_id, received_at, id);
ALTER TABLE leads ADD INDEX IF NOT EXISTS lead_status_received_at_id (status, received_at, id);
