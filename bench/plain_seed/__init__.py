"""The plain seed: the two articles Floodgate grew from, written as they read and nothing more
(bench/versus.py measures Floodgate against it). Not part of Floodgate; never imported by it."""
