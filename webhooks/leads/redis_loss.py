"""Recovery from a Redis data loss (a restart without its data, a failover to a replica behind).
Nothing here runs: what Redis holds, what is lost and which code puts each piece back is the
table in docs/architecture.md "When Redis loses its data"; the story and its tests are in
docs/leads.md "Recovery"."""
