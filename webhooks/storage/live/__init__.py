"""What Floodgate keeps in Redis: the live state of leads and payments (cap counters, leases,
claims, the settlement and events queues, the erasure feed), reached through one typed store."""
