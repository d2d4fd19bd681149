"""Lead routing under caps, one folder per capability, each layer importing only those below
it (pyproject's import contracts): `path` (intake, routing, recovery, settlement) over
`accounting` (the ledger, returns, reports) over `rules` (publishers, buyers, the catalog)
over `posting` (a buyer's templates and the call)."""
