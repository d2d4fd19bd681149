"""Events to applications (API.md "Event endpoints"; DESIGN.md "Events"): one outbox for every
event type and one delivery engine for every endpoint.

- `outbox`: the event rows, written in the transaction of the change they announce (a wallet
  credited or debited by payments, a lead sold or returned by leads).
- `endpoints`: the applications' endpoints (types, publisher, secret, enabled) and which
  events each wants.
- `delivery`: the worker's engine: fan-out into one delivery per matching endpoint, then
  signed POSTs in order per endpoint and entity, with retries, back-off and disabling.
- `log`: what the admin API and /ops show (events with their attempts, replay, backlog).

Leads and payments both write here and know nothing of each other; this package knows
neither (the import-linter contracts in pyproject.toml).
"""
