-- A buyer's console page (docs/operations.md "A buyer's page"). Idempotent, like every migration.
--   lead_stats (buyer_id, hour)  the report's rows of one buyer over a range of hours: its row of
--                                the report by buyer for the last 7 days reads its few thousand
--                                rows, where the (hour, ...) key made MariaDB read every buyer's
--                                rows of the week (about 110 ms at the report bench's worst
--                                case of 20 publishers × 17 buyers, 20 ms with this index)
CREATE INDEX IF NOT EXISTS leadstats_buyer_id_hour ON lead_stats (buyer_id, hour);
