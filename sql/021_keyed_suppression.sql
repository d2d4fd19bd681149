-- Plain suppression lists keyed (docs/leads.md "Suppression lists"). Idempotent.
--   suppression_lists.digest_key  for a list of hash "none": the id of the SUPPRESSION_KEY its
--                                 entries are keyed hashes under; NULL for its entries as
--                                 sql/018 wrote them (a bare SHA-256 prefix), until
--                                 `floodgate suppression rehash` rewrites them
ALTER TABLE suppression_lists
  ADD COLUMN IF NOT EXISTS digest_key VARCHAR(16) NULL;
