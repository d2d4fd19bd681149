"""What the tests, the benchmarks and the soak share: real servers to start (servers.py,
cluster.py), the lean buyer stub of bench/ and soak/ (buyer_stub.py), the providers' payloads
and signatures (payments.py), a Standard Webhooks receiver (events.py) and the run's secrets
(config.py). bench/ and soak/ import this, never tests/."""
