-- The lead search (GET /v1/admin/leads, leads/accounting/search.py): newest first, filtered by
-- publisher, buyer or status, a page at a time from a keyset cursor (received_at, id). Each
-- filter gets an index that starts with it and goes on with the sort key, so a page reads the
-- index from the cursor on, at any depth; the other two filters follow, so that the page's ids
-- are found in the index alone (a page of `publisher_id` and `buyer_id` that few leads match
-- walks index entries, never rows). A search without those filters walks lead_received_at
-- (sql/012), which InnoDB extends with the primary key: (received_at, id).
-- Online (no table copy); idempotent, like every migration (MariaDB's IF NOT EXISTS).
ALTER TABLE leads ADD INDEX IF NOT EXISTS lead_search_publisher (publisher_id, received_at, id, buyer_id, status);
ALTER TABLE leads ADD INDEX IF NOT EXISTS lead_search_buyer (buyer_id, received_at, id, publisher_id, status);
ALTER TABLE leads ADD INDEX IF NOT EXISTS lead_search_status (status, received_at, id, publisher_id, buyer_id);
