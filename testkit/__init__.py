"""What the tests and the benchmarks share: real servers to start (servers.py, cluster.py),
the providers' payloads and signatures (payments.py), a Standard Webhooks receiver (events.py)
and the run's secrets (config.py). bench/ imports this, never tests/."""
