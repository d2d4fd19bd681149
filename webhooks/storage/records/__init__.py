"""What Floodgate keeps in the database: the ledger's records (models checked against sql/),
their migrations, the audit log and the fast INSERTs of the hottest transactions."""
