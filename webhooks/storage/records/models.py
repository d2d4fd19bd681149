"""peewee models of the ledger. They must agree with sql/*.sql (tests/storage/records/test_migrate.py checks it)."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import peewee as pw

from webhooks.storage.records.db import db


def utcnow() -> datetime:
    """Naive UTC with microseconds: what DATETIME(6) columns hold."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


class DateTime6Field(pw.DateTimeField):
    """A naive UTC datetime in and out, on MySQL and SQLite alike. An aware one is stored as
    its UTC time (PyMySQL would drop its zone, SQLite's adapter would keep it in the text);
    SQLite's text of one stored with a zone is read back as naive UTC, as MySQL reads."""

    field_type = "DATETIME(6)"

    def db_value(self, value: Any) -> Any:
        if isinstance(value, datetime) and value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return super().db_value(value)  # type: ignore[no-untyped-call]

    def python_value(self, value: Any) -> Any:
        value = super().python_value(value)  # type: ignore[no-untyped-call]
        if isinstance(value, datetime) and value.tzinfo is not None:
            return value.astimezone(timezone.utc).replace(tzinfo=None)
        return value


class DecimalField(pw.DecimalField):
    """A DECIMAL read with its column's places on SQLite too: MySQL answers Decimal("2.00");
    SQLite keeps a DECIMAL as an integer or a float (2, 0.30000000000000004), which peewee
    would read as Decimal("2") and Decimal("0.30000000000000004")."""

    def python_value(self, value: Any) -> Any:
        if value is None or isinstance(value, Decimal):
            return value
        return Decimal(str(value)).quantize(self._exp)  # type: ignore[attr-defined]  # 10 ** -places


class MediumTextField(pw.TextField):
    field_type = "MEDIUMTEXT"


class MediumBlobField(pw.BlobField):
    field_type = "MEDIUMBLOB"


class BaseModel(pw.Model):
    class Meta:
        database = db
        legacy_table_names = False


class SchemaMigration(BaseModel):
    version = pw.CharField(max_length=32, primary_key=True)
    applied_at = DateTime6Field(default=utcnow)

    class Meta:
        table_name = "schema_migrations"


class Publisher(BaseModel):
    id = pw.CharField(max_length=64, primary_key=True)
    name = pw.CharField(max_length=200)
    api_key_hash = pw.CharField(max_length=64, unique=True)
    api_key_hint = pw.CharField(max_length=8)
    commission_pct = DecimalField(max_digits=5, decimal_places=2)
    active = pw.BooleanField(default=True)
    balance = DecimalField(max_digits=14, decimal_places=2, default=0)
    created_at = DateTime6Field(default=utcnow)
    updated_at = DateTime6Field(default=utcnow)
    routing = pw.CharField(max_length=16, default="waterfall")  # waterfall | price | round_robin | weighted
    # rate_limit (docs/api.md): a token bucket of rate_burst leads refilled at rate_per_second; both
    # NULL: the PUBLISHER_RATE_LIMIT default applies
    rate_per_second = pw.IntegerField(null=True)
    rate_burst = pw.IntegerField(null=True)
    fields_spec = pw.TextField(null=True)  # JSON: the lead spec (`fields`, leads/rules/quality.py); NULL: none
    mode = pw.CharField(max_length=8, default="live")  # live | test (every lead a test lead)
    # payout (docs/api.md): a fixed amount per sold lead; NULL: commission_pct of the sale price
    payout_fixed = DecimalField(max_digits=12, decimal_places=2, null=True)
    # caps (docs/api.md): leads accepted per UTC hour / day; NULL: unlimited
    cap_hourly = pw.IntegerField(null=True)
    cap_daily = pw.IntegerField(null=True)
    suppress = pw.TextField(null=True)  # JSON: the suppression lists its leads are refused by (sql/018)
    # `precheck` (sql/020): its pre-ping quota; NULL: the default (leads/rules/precheck_quota.py)
    precheck_per_lead = pw.IntegerField(null=True)
    precheck_daily_floor = pw.IntegerField(null=True)
    # payout holds (sql/024): days a sale's payout is held before it is payable, and the sum of
    # its payouts held now (`balance` is what is payable: docs/leads.md "Payout holds")
    payout_hold_days = pw.IntegerField(default=0)
    payout_held = DecimalField(max_digits=14, decimal_places=2, default=0)
    max_sales = pw.IntegerField(default=1)  # `sell.max_sales` (sql/025): buyers one lead may be sold to
    epl_window_days = pw.IntegerField(default=7)  # the days `routing: epl` ranks by (sql/027)

    class Meta:
        table_name = "publishers"


class Buyer(BaseModel):
    id = pw.CharField(max_length=64, primary_key=True)
    name = pw.CharField(max_length=200)
    endpoint_url = pw.CharField(max_length=2048)
    priority = pw.IntegerField()
    price = DecimalField(max_digits=12, decimal_places=2)
    timezone = pw.CharField(max_length=64)
    cap_hourly = pw.IntegerField(null=True)
    cap_daily = pw.IntegerField(null=True)
    cap_weekly = pw.IntegerField(null=True)
    cap_monthly = pw.IntegerField(null=True)
    cap_daily_budget = DecimalField(max_digits=12, decimal_places=2, null=True)
    states = pw.TextField()  # JSON list, upper-case
    blocked_publishers = pw.TextField()  # JSON list
    schedule = pw.TextField(null=True)  # JSON object or NULL (always open)
    active = pw.BooleanField(default=True)
    deleted_at = DateTime6Field(null=True)
    created_at = DateTime6Field(default=utcnow)
    updated_at = DateTime6Field(default=utcnow)
    delivery = pw.TextField(null=True)  # JSON: method, format, headers, fields, accept | accept_regex
    ping = pw.TextField(null=True)  # JSON: url, fields, bid, min_bid
    weight = pw.IntegerField(default=1)  # share within a priority under `weighted` routing
    lead_filter = pw.TextField(null=True)  # `filter`: a JMESPath expression on the normalised lead; NULL: none
    dedupe = pw.TextField(null=True)  # JSON: fields, days
    return_window_days = pw.IntegerField(default=7)
    billing = pw.TextField(null=True)  # JSON: mode, account, currency, credit_limit, low_balance (sql/016)
    billing_account = pw.CharField(max_length=300, null=True, index=True)  # "<account>|<currency>"
    suppress = pw.TextField(null=True)  # JSON: suppression lists whose leads it is not offered (sql/018)
    require_consent = pw.TextField(null=True)  # JSON: consent it requires claimed, e.g. ["trustedform"]
    # JSON: its return policy but the window (max_pct, period_days, reasons, review; sql/022); NULL: defaults
    return_policy = pw.TextField(null=True)
    # SHA-256 of its buyer API key (sql/023); NULL: none issued. Found by its unique index.
    api_key_hash = pw.CharField(max_length=64, null=True, unique=True)
    contract = pw.CharField(max_length=16, default="exclusive")  # exclusive | shared (sql/025)

    class Meta:
        table_name = "buyers"


class Lead(BaseModel):
    id = pw.BigAutoField()
    publisher_id = pw.CharField(max_length=64)
    lead_id = pw.CharField(max_length=64)
    status = pw.CharField(max_length=16)
    buyer_id = pw.CharField(max_length=64, null=True)
    price = DecimalField(max_digits=12, decimal_places=2, null=True)
    payout = DecimalField(max_digits=12, decimal_places=2, null=True, column_name="commission")
    payload = MediumTextField()
    received_at = DateTime6Field()
    sold_at = DateTime6Field(null=True)
    settled_at = DateTime6Field(default=utcnow)
    request_id = pw.CharField(max_length=64, null=True)
    lease_id = pw.CharField(max_length=32, null=True)  # the cap lease of the sale
    reserved_us = pw.BigIntegerField(null=True)  # Redis time of that lease, for reconciliation
    skipped = pw.TextField(null=True)  # JSON: [{buyer_id, reason}] of the buyers not attempted
    returned_at = DateTime6Field(null=True)
    return_reason = pw.CharField(max_length=500, null=True)
    charge_minor = pw.BigIntegerField(null=True)  # debited from the buyer's wallet (sql/016)
    charge_account = pw.CharField(max_length=300, null=True)  # that wallet: "<account>|<currency>"

    consent = pw.TextField(null=True)  # JSON: the consent claims made for the lead (sql/018)
    # its consumer keys as keyed digests, for the lookup by e-mail or phone; emptied with its
    # body (sql/030, leads/accounting/ledger.py lookup_digests)
    email_digest = pw.CharField(max_length=32, null=True)
    phone_digest = pw.CharField(max_length=32, null=True)

    class Meta:
        table_name = "leads"
        indexes = (
            (("publisher_id", "lead_id"), True),
            (("buyer_id", "sold_at"), False),
            (("lead_id",), False),
            (("received_at",), False),  # the body purge's walk (sql/012); the unfiltered search
            # the lead search by each filter, newest first from a keyset cursor; the other
            # filters after the sort key, so that a page's ids come from the index alone (sql/017)
            (("publisher_id", "received_at", "id", "buyer_id", "status"), False),
            (("buyer_id", "received_at", "id", "publisher_id", "status"), False),
            (("status", "received_at", "id", "publisher_id", "buyer_id"), False),
            (("email_digest",), False),  # the lookup by e-mail or phone (sql/030)
            (("phone_digest",), False),
        )


class Sale(BaseModel):
    """One sale of a lead to one buyer (sql/022): a lead has zero or more. The unique key keeps a
    buyer from buying one lead twice and a settlement written twice from writing a sale twice."""

    id = pw.BigAutoField()
    publisher_id = pw.CharField(max_length=64)
    lead_id = pw.CharField(max_length=64)
    buyer_id = pw.CharField(max_length=64)
    price = DecimalField(max_digits=12, decimal_places=2)
    payout = DecimalField(max_digits=12, decimal_places=2, null=True)  # the publisher's for this sale
    status = pw.CharField(max_length=16)  # a SaleStatus
    sold_at = DateTime6Field()
    returned_at = DateTime6Field(null=True)
    return_reason = pw.CharField(max_length=500, null=True)
    charge_minor = pw.BigIntegerField(null=True)  # debited from the buyer's wallet
    charge_account = pw.CharField(max_length=300, null=True)  # that wallet: "<account>|<currency>"
    lease_id = pw.CharField(max_length=32, null=True)  # the cap lease of the sale
    reserved_us = pw.BigIntegerField(null=True)  # Redis time of that lease, for reconciliation
    # a PayoutState (sql/024); the DDL's default too, for sql/022's copy on SQLite (no hold then)
    payout_state = pw.CharField(max_length=16, default="payable", constraints=[pw.SQL("DEFAULT 'payable'")])
    payable_at = DateTime6Field(null=True)  # when its hold ends; NULL: sold before holds existed

    class Meta:
        table_name = "sales"
        indexes = (
            (("publisher_id", "lead_id", "buyer_id"), True),
            (("buyer_id", "sold_at"), False),  # a buyer's return limit over its period
            (("payout_state", "payable_at"), False),  # the payouts whose hold is over
            # a publisher's statement: its sales of a month, and its returns of a month, each added
            # up from the index alone, and read in (time, id) order (sql/031)
            (("publisher_id", "sold_at", "id", "payout_state", "payout"), False),
            (("publisher_id", "returned_at", "id", "status", "payout_state", "payout"), False),
            (("buyer_id", "status", "sold_at"), False),  # a buyer's list by status (sql/023)
            (("buyer_id", "lead_id"), False),  # a buyer's sales of one lead id (sql/031)
        )


class LeadReturn(BaseModel):
    """A return asked for one sale (sql/022): pending while an operator reviews it, approved
    (an automatic return is approved as it is made) or rejected."""

    id = pw.BigAutoField()
    return_id = pw.CharField(max_length=32, unique=True)
    sale_id = pw.BigIntegerField(index=True)
    publisher_id = pw.CharField(max_length=64)
    lead_id = pw.CharField(max_length=64)
    buyer_id = pw.CharField(max_length=64)
    reason = pw.CharField(max_length=500, null=True)
    status = pw.CharField(max_length=16)  # a ReturnStatus
    requested_at = DateTime6Field()
    decided_at = DateTime6Field(null=True)
    actor = pw.CharField(max_length=80, null=True)  # admin, cli, buyer:<id> (sql/023)

    class Meta:
        table_name = "lead_returns"
        indexes = ((("status", "requested_at"), False),)  # the review queue, oldest first


class Feedback(BaseModel):
    """What a buyer said of one of its sales (sql/026). The unique key, the buyer's own id for
    it, makes feedback sent again (or many times at once) stored once."""

    id = pw.BigAutoField()
    buyer_id = pw.CharField(max_length=64)
    feedback_id = pw.CharField(max_length=64)  # the buyer's
    sale_id = pw.BigIntegerField(index=True)
    publisher_id = pw.CharField(max_length=64)
    lead_id = pw.CharField(max_length=64)
    event = pw.CharField(max_length=16)  # a FeedbackEvent
    value = DecimalField(max_digits=12, decimal_places=2, null=True)
    created_at = DateTime6Field()

    class Meta:
        table_name = "feedback"
        indexes = ((("buyer_id", "feedback_id"), True),)


class LeadAttempt(BaseModel):
    id = pw.BigAutoField()
    publisher_id = pw.CharField(max_length=64)
    lead_id = pw.CharField(max_length=64)
    seq = pw.SmallIntegerField()
    buyer_id = pw.CharField(max_length=64)
    outcome = pw.CharField(max_length=16)
    ms = pw.IntegerField()
    bid = DecimalField(max_digits=12, decimal_places=2, null=True)  # ping/post buyers

    class Meta:
        table_name = "lead_attempts"
        indexes = (
            (("publisher_id", "lead_id", "seq"), True),
            (("outcome",), False),  # the leads flagged for review (sql/019)
        )


class Payment(BaseModel):
    id = pw.BigAutoField()
    provider = pw.CharField(max_length=32)
    reference = pw.CharField(max_length=128)
    amount_minor = pw.BigIntegerField()
    currency = pw.CharField(max_length=3)
    customer = pw.CharField(max_length=254)  # the wallet; '' while unattributed
    status = pw.CharField(max_length=24)  # unattributed | credited | partially_refunded | refunded
    event_type = pw.CharField(max_length=64)
    received_at = DateTime6Field()
    credited_at = DateTime6Field(null=True)
    refunded_minor = pw.BigIntegerField(default=0)  # sum of its refunds, never above amount_minor
    payer = pw.CharField(max_length=254, null=True)  # the payer's e-mail as sent
    fees_minor = pw.BigIntegerField(default=0)  # the provider's fee passed on to the payer
    flag = pw.CharField(max_length=32, null=True)  # partially_paid | overpaid
    source = pw.CharField(max_length=16, default="webhook")  # webhook | reconciliation
    assigned_at = DateTime6Field(null=True)
    disputed_minor = pw.BigIntegerField(default=0)  # what disputes hold withdrawn now (sql/013)
    refund_unnamed_minor = pw.BigIntegerField(default=0)  # charge.refunded's debit no refund id claimed yet

    class Meta:
        table_name = "payments"
        indexes = (
            (("provider", "reference"), True),
            (("status", "received_at"), False),
            (("received_at", "id"), False),  # the console's list, newest first (sql/032)
            (("customer", "currency", "received_at", "id"), False),  # a wallet's payments (sql/032)
        )


class Refund(BaseModel):
    """A refund or reversal of a payment: debits the payer's wallet once per (provider, reference)."""

    id = pw.BigAutoField()
    provider = pw.CharField(max_length=32)
    reference = pw.CharField(max_length=128)  # the refund's own reference
    payment_reference = pw.CharField(max_length=128)
    amount_minor = pw.BigIntegerField()
    currency = pw.CharField(max_length=3)
    customer = pw.CharField(max_length=254)
    event_type = pw.CharField(max_length=64)
    received_at = DateTime6Field()
    debited_at = DateTime6Field()
    status = pw.CharField(max_length=16, default="debited")  # debited | reversed (sql/013)
    debited_minor = pw.BigIntegerField(null=True)  # what the wallet counts of it (NULL: amount_minor)
    flag = pw.CharField(max_length=32, null=True)  # refund_includes_fee
    reversed_at = DateTime6Field(null=True)

    class Meta:
        table_name = "refunds"
        indexes = (
            (("provider", "reference"), True),
            (("provider", "payment_reference"), False),
        )


class PaymentDispute(BaseModel):
    """A dispute (chargeback) of a payment, keyed by the provider's dispute id: its money leaves
    the wallet at most once (withdrawn) and comes back at most once (reinstated)."""

    id = pw.BigAutoField()
    provider = pw.CharField(max_length=32)
    reference = pw.CharField(max_length=128)  # the provider's dispute id
    payment_reference = pw.CharField(max_length=128)
    amount_minor = pw.BigIntegerField()
    currency = pw.CharField(max_length=3)
    customer = pw.CharField(max_length=254)  # the wallet ('' while the payment is unattributed)
    status = pw.CharField(max_length=16)  # withdrawn | reinstated
    event_type = pw.CharField(max_length=64)
    received_at = DateTime6Field()
    withdrawn_at = DateTime6Field(null=True)  # NULL: reinstated before any withdrawal arrived
    reinstated_at = DateTime6Field(null=True)

    class Meta:
        table_name = "payment_disputes"
        indexes = (
            (("provider", "reference"), True),
            (("provider", "payment_reference"), False),
        )


class LegacyPaymentEvent(BaseModel):
    """The payment events outbox before sql/011 (one endpoint, PAYMENT_EVENTS_URL): read only
    by that migration, which carries its rows over into events and their dispatches."""

    id = pw.BigAutoField()
    event_id = pw.CharField(max_length=64, unique=True)  # the stable webhook-id
    type = pw.CharField(max_length=32)  # wallet.credited | wallet.debited
    provider = pw.CharField(max_length=32)
    reference = pw.CharField(max_length=128)  # the payment's or the refund's
    customer = pw.CharField(max_length=254)
    body = pw.TextField()  # the JSON sent, fixed when the event is made
    status = pw.CharField(max_length=16)  # pending | delivered | failed
    attempts = pw.IntegerField(default=0)
    created_at = DateTime6Field()
    next_attempt_at = DateTime6Field()
    first_attempt_at = DateTime6Field(null=True)
    last_attempt_at = DateTime6Field(null=True)
    delivered_at = DateTime6Field(null=True)
    last_error = pw.CharField(max_length=500, null=True)

    class Meta:
        table_name = "payment_events"
        indexes = (
            (("provider", "type", "reference"), True),
            (("status", "customer", "id"), False),  # each customer's oldest undelivered event
        )


class EventEndpoint(BaseModel):
    """An application's endpoint for events (docs/api.md "Event endpoints"): what it wants and its
    state. The endpoint PAYMENT_EVENTS_URL configures is a row too (events/endpoints.py)."""

    id = pw.CharField(max_length=64, primary_key=True)
    url = pw.CharField(max_length=2048)
    types = pw.TextField(null=True)  # JSON list of event types; NULL: every type
    publisher_id = pw.CharField(max_length=64, null=True)  # lead events of this publisher only
    secret = pw.CharField(max_length=200, null=True)  # whsec_...; NULL: PAYMENT_EVENTS_SECRET signs
    enabled = pw.BooleanField(default=True)
    disabled_reason = pw.CharField(max_length=16, null=True)  # paused | failing
    disabled_at = DateTime6Field(null=True)
    failing_since = DateTime6Field(null=True)  # the first failed attempt since the last success
    last_error = pw.CharField(max_length=500, null=True)
    last_attempt_at = DateTime6Field(null=True)
    last_success_at = DateTime6Field(null=True)
    created_at = DateTime6Field(default=utcnow)
    updated_at = DateTime6Field(default=utcnow)

    class Meta:
        table_name = "event_endpoints"


class Event(BaseModel):
    """The outbox: one row per announced change (a wallet credited or debited, a lead sold or
    returned), inserted in the transaction that makes the change. The worker fans it out into
    one EventDispatch per matching endpoint (`fanned_out`)."""

    id = pw.BigAutoField()
    event_id = pw.CharField(max_length=64, unique=True)  # msg_...: shown by the admin API
    type = pw.CharField(max_length=32)
    subject = pw.CharField(max_length=200)  # what changed: provider:reference, publisher:lead_id
    entity = pw.CharField(max_length=254)  # the order key: the wallet's customer, the lead
    publisher_id = pw.CharField(max_length=64, null=True)  # lead events: whose lead
    body = pw.TextField()  # the JSON sent, fixed when the event is made
    created_at = DateTime6Field()
    fanned_out = pw.BooleanField(default=False)

    class Meta:
        table_name = "events"
        indexes = (
            (("type", "subject"), True),  # one event per change
            (("fanned_out", "id"), False),
            (("created_at",), False),
        )


class EventDispatch(BaseModel):
    """One event sent to one endpoint: its stable `webhook-id`, its state and its retries (its
    attempts are EventAttempt rows). Its table was renamed by sql/014."""

    id = pw.BigAutoField()
    event = pw.BigIntegerField(column_name="event_id")  # Event.id
    endpoint_id = pw.CharField(max_length=64)
    entity = pw.CharField(max_length=254)  # the event's: one endpoint's dispatches of it go in order
    webhook_id = pw.CharField(max_length=64)
    status = pw.CharField(max_length=16)  # pending | delivered | failed
    attempts = pw.IntegerField(default=0)
    created_at = DateTime6Field()
    next_attempt_at = DateTime6Field()
    first_attempt_at = DateTime6Field(null=True)
    last_attempt_at = DateTime6Field(null=True)
    delivered_at = DateTime6Field(null=True)
    last_error = pw.CharField(max_length=500, null=True)

    class Meta:
        table_name = "event_dispatches"
        indexes = (
            (("event_id", "endpoint_id"), True),
            (("endpoint_id", "status", "next_attempt_at"), False),  # what is due, per endpoint
            (("entity", "endpoint_id", "status", "id"), False),  # one endpoint's queue of one entity
        )


class EventAttempt(BaseModel):
    """The events log: every attempt to send an event, with what the endpoint answered."""

    id = pw.BigAutoField()
    dispatch_id = pw.BigIntegerField(column_name="delivery_id")  # EventDispatch.id (the column: sql/011)
    at = DateTime6Field()
    status_code = pw.SmallIntegerField(null=True)  # NULL: no answer (refused, timed out)
    error = pw.CharField(max_length=500, null=True)  # NULL: delivered
    ms = pw.IntegerField()

    class Meta:
        table_name = "event_attempts"
        indexes = ((("dispatch_id", "id"), False),)


class Wallet(BaseModel):
    id = pw.BigAutoField()
    customer = pw.CharField(max_length=254)
    currency = pw.CharField(max_length=3)
    balance_minor = pw.BigIntegerField(default=0)
    updated_at = DateTime6Field(default=utcnow)
    version = pw.BigIntegerField(default=0)  # its changes so far (sql/016)

    class Meta:
        table_name = "wallets"
        indexes = ((("customer", "currency"), True),)


class WalletEntry(BaseModel):
    """One move of a wallet, written in its transaction (sql/016): the statement's lines."""

    id = pw.BigAutoField()
    customer = pw.CharField(max_length=254)
    currency = pw.CharField(max_length=3)
    kind = pw.CharField(max_length=16)  # top_up | sale | return | refund | dispute | carried
    amount_minor = pw.BigIntegerField()  # signed: what the wallet moved by
    reference = pw.CharField(max_length=300)
    at = DateTime6Field()

    class Meta:
        table_name = "wallet_entries"
        indexes = ((("customer", "currency", "at"), False),)


class WalletDay(BaseModel):
    """A wallet's journal rows of one UTC day and kind, added up once the day is over
    (billing/wallet_days.py, sql/031)."""

    id = pw.BigAutoField()
    customer = pw.CharField(max_length=254)
    currency = pw.CharField(max_length=3)
    day = pw.DateField()
    kind = pw.CharField(max_length=16)
    amount_minor = pw.BigIntegerField()

    class Meta:
        table_name = "wallet_days"
        indexes = ((("customer", "currency", "day", "kind"), True),)


class WalletDaysDone(BaseModel):
    """The last day of a wallet whose rows wallet_days holds (every day before it too)."""

    id = pw.BigAutoField()
    customer = pw.CharField(max_length=254)
    currency = pw.CharField(max_length=3)
    through_day = pw.DateField()

    class Meta:
        table_name = "wallet_days_done"
        indexes = ((("customer", "currency"), True),)


class SuppressionList(BaseModel):
    """A suppression list (sql/018): the lead field it holds, how its entries are hashed, and how
    many it holds."""

    id = pw.CharField(max_length=64, primary_key=True)
    field = pw.CharField(max_length=16)  # email | phone
    hash = pw.CharField(max_length=8)  # md5 | sha256 | none
    # a "none" list's entries: keyed hashes under the SUPPRESSION_KEY of this id, or NULL for
    # the bare digests sql/018 wrote, until they are rehashed (sql/021)
    digest_key = pw.CharField(max_length=16, null=True)
    size = pw.BigIntegerField(default=0)
    created_at = DateTime6Field(default=utcnow)
    updated_at = DateTime6Field(default=utcnow)

    class Meta:
        table_name = "suppression_lists"


class SuppressionEntry(BaseModel):
    """One entry of a list, as the digest Redis holds (hex): never the plain value."""

    id = pw.BigAutoField()
    list_id = pw.CharField(max_length=64)
    digest = pw.CharField(max_length=64)

    class Meta:
        table_name = "suppression_entries"
        indexes = ((("list_id", "digest"), True),)


class LeadStats(BaseModel):
    """The leads report's figures per hour (received_at, UTC), publisher and buyer ('' for
    leads no buyer bought), kept in the transactions of the ledger changes they count: a
    settlement adds its leads, a return its return (leads/accounting/reports.py)."""

    id = pw.BigAutoField()
    hour = DateTime6Field()  # naive UTC, on the hour
    publisher_id = pw.CharField(max_length=64)
    buyer_id = pw.CharField(max_length=64)
    leads = pw.IntegerField(default=0)
    sold = pw.IntegerField(default=0)  # returned ones included
    returned = pw.IntegerField(default=0)
    revenue = DecimalField(max_digits=16, decimal_places=2, default=0)  # of the sales not returned
    payout = DecimalField(max_digits=16, decimal_places=2, default=0)  # of the sales not returned
    sales = pw.IntegerField(null=True)  # sales to this row's buyer, returned ones included (sql/025)
    # sql/026; the DDL's default too, for the rows a statement of SQL writes without them
    offers = pw.IntegerField(default=0, constraints=[pw.SQL("DEFAULT 0")])  # attempts made to this row's buyer
    accepted = pw.IntegerField(default=0, constraints=[pw.SQL("DEFAULT 0")])  # those it accepted
    # its sales whose buyer said `converted`, once each
    conversions = pw.IntegerField(default=0, constraints=[pw.SQL("DEFAULT 0")])

    class Meta:
        table_name = "lead_stats"
        # (hour, publisher_id, buyer_id): on MySQL its primary key, so that a range of hours is
        # read in place (sql/031)
        indexes = ((("hour", "publisher_id", "buyer_id"), True), (("buyer_id", "hour"), False))  # sql/033


class LeadStatsDay(BaseModel):
    """`lead_stats` added up per UTC day, publisher and buyer, kept beside it in the same
    transactions (leads/accounting/reports.py): a report of whole days by day, publisher or
    buyer reads a row per day, not 24 (sql/034)."""

    id = pw.BigAutoField()
    day = pw.DateField()  # of the leads' received_at, UTC
    publisher_id = pw.CharField(max_length=64)
    buyer_id = pw.CharField(max_length=64)
    leads = pw.IntegerField(default=0)
    sold = pw.IntegerField(default=0)
    returned = pw.IntegerField(default=0)
    revenue = pw.DecimalField(max_digits=16, decimal_places=2, default=0)
    payout = pw.DecimalField(max_digits=16, decimal_places=2, default=0)
    sales = pw.IntegerField(default=0)
    offers = pw.IntegerField(default=0)
    accepted = pw.IntegerField(default=0)
    conversions = pw.IntegerField(default=0)

    class Meta:
        table_name = "lead_stats_days"
        # (day, publisher_id, buyer_id): on MySQL its primary key, as lead_stats' (sql/034)
        indexes = ((("day", "publisher_id", "buyer_id"), True), (("buyer_id", "day"), False))


class WebhookCall(BaseModel):
    """Every webhook call of a payment provider, kept for audit and replay: verified ones with
    their headers of interest and body; one that failed its signature check as metadata only
    (provider, verdict, length and SHA-256 of the body), so a forger cannot fill the database.
    Its table was renamed by sql/014."""

    id = pw.BigAutoField()
    provider = pw.CharField(max_length=32)
    reference = pw.CharField(max_length=128, null=True)
    event_type = pw.CharField(max_length=64, null=True)
    verdict = pw.CharField(max_length=32)
    status_code = pw.SmallIntegerField()
    headers = pw.TextField()  # JSON object of the headers of interest ({} when not verified)
    body = MediumBlobField()  # empty when not verified
    body_truncated = pw.BooleanField(default=False)
    received_at = DateTime6Field(default=utcnow)
    body_length = pw.IntegerField(null=True)  # bytes received (NULL: rows older than sql/002)
    body_sha256 = pw.CharField(max_length=64, null=True)  # hex
    reason = pw.CharField(max_length=32, null=True)  # why an `ignored` one moved nothing (sql/013)

    class Meta:
        table_name = "webhook_calls"
        indexes = ((("provider", "reference"), False), (("verdict", "received_at"), False))


class AuditLog(BaseModel):
    id = pw.BigAutoField()
    at = DateTime6Field(default=utcnow)
    actor = pw.CharField(max_length=80)  # buyer:<id> among them (sql/023)
    action = pw.CharField(max_length=64)
    entity = pw.CharField(max_length=32)
    entity_id = pw.CharField(max_length=200)
    detail = pw.TextField(null=True)

    class Meta:
        table_name = "audit_log"
        indexes = ((("entity", "entity_id"), False),)


class User(BaseModel):
    """An operator user (sql/028): logs in on /ops by e-mail, password and, for an owner or an
    admin, a TOTP code (webhooks/web/people/); or a portal user (sql/029) of role `buyer` or
    `publisher`, tied to its buyer or publisher, who logs in on /portal (webhooks/web/portal/)."""

    id = pw.BigAutoField()
    email = pw.CharField(max_length=254, unique=True)  # lower-cased
    role = pw.CharField(max_length=16)  # a people.accounts.Role
    password_hash = pw.CharField(max_length=255, null=True)  # argon2id; NULL until set up
    totp_secret = pw.CharField(max_length=64, null=True)  # base32; NULL for an analyst
    setup_digest = pw.CharField(max_length=64, null=True, unique=True)  # SHA-256 of the set-up token
    setup_expires_at = DateTime6Field(null=True)
    active = pw.BooleanField(default=True)
    created_at = DateTime6Field(default=utcnow)
    updated_at = DateTime6Field(default=utcnow)
    buyer_id = pw.CharField(max_length=64, null=True)  # a `buyer` user's buyer; NULL otherwise
    publisher_id = pw.CharField(max_length=64, null=True)  # a `publisher` user's publisher

    class Meta:
        table_name = "users"


ALL_MODELS = [
    SchemaMigration,
    Publisher,
    Buyer,
    Lead,
    LeadAttempt,
    Sale,
    LeadReturn,
    Feedback,
    Payment,
    Wallet,
    WalletEntry,
    WalletDay,
    WalletDaysDone,
    WebhookCall,
    AuditLog,
    Refund,
    PaymentDispute,
    LegacyPaymentEvent,
    LeadStats,
    LeadStatsDay,
    EventEndpoint,
    Event,
    EventDispatch,
    EventAttempt,
    SuppressionList,
    SuppressionEntry,
    User,
]
