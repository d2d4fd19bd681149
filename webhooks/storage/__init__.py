"""Storage plumbing: the Redis store with its typed scripts, key names, claims, the
settlement queue, the database, its models, migrations and the audit log."""
