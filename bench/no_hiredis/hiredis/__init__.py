"""Shadows an installed hiredis for bench/levers.py's base arm: redis-py then uses its own
Python parser (it checks `import hiredis` once, at import)."""

raise ImportError("hiredis hidden by bench/no_hiredis")
