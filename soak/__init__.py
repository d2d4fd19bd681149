"""The soak under faults (`scripts/soak`): the Procfile stack under mixed traffic while its
processes die, then the invariants checked; a correctness test, not a benchmark (run.py)."""
