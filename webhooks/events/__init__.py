"""Events to applications: one outbox for every event type (`outbox`), the applications'
endpoints (`endpoints`), one sending engine for every endpoint (`sender`) and what the admin
API and /ops show (`log`). Leads and payments both write here and this package knows neither.
The contract: docs/api.md "Event endpoints"; the flow: docs/architecture.md; the behaviour:
docs/events.md."""
