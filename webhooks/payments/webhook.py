"""One payment webhook, from its raw bytes to its answer, without Flask: web/payments.py passes
the request's parts to `PaymentWebhooks.receive` and sends back the Answer. Verify
(signatures.py), parse (notifications.py), dedupe and claim (gate.py), confirm (Flutterwave), credit
(ledger.py) or move money going back (refunds.py, disputes.py) in one transaction with its
event, release the claim, wake the events worker. The steps and the audit rows:
docs/payments.md "Flow" and "Audit trail"; the arrows: docs/architecture.md."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisClusterException
from rq import Queue

from webhooks import metrics
from webhooks.billing import balance
from webhooks.config import Config
from webhooks.errors import (
    FloodgateError,
    InvalidJSON,
    InvalidPayload,
    InvalidSignature,
    NotConfirmed,
    NotFound,
    PaymentNotFound,
    ValidationError,
)
from webhooks.events.endpoints import Listening
from webhooks.payments import disputes, gate, ledger, refunds, rejected
from webhooks.payments.ledger import Receipt
from webhooks.payments.providers import flutterwave, notifications, signatures
from webhooks.payments.states import Ignored, Motion, Source, Verdict
from webhooks.storage.live import outbox_queue
from webhooks.storage.live.claims import Claim
from webhooks.storage.live.redis import REDIS_DOWN, Store
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, borrowed
from webhooks.storage.records.models import Payment

log = logging.getLogger(__name__)


class Stopwatch:
    """Per-phase durations, sent as a Server-Timing header (what bench/ reads server-side)."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.laps: list[str] = []

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append(f"{name};dur={(now - self.last) * 1000:.3f}")
        self.last = now

    def header(self) -> str:
        return ", ".join(self.laps + [f"total;dur={(time.perf_counter() - self.start) * 1000:.3f}"])


@dataclass(frozen=True)
class Answer:
    """What the view answers: `{"status": status}` with `http_status` and the extra headers;
    with `message` (payment_not_found) the body is also the error shape."""

    status: Verdict
    http_status: int
    headers: Mapping[str, str]  # Server-Timing
    message: str | None = None
    reason: str | None = None  # why an `ignored` one moved nothing

    def body(self) -> dict[str, Any]:
        if self.reason is not None:
            return {"status": self.status, "reason": self.reason}
        if self.message is None:
            return {"status": self.status}
        return {"status": self.status, "error": {"code": self.status, "message": self.message}}


def _answer(
    status: Verdict, http_status: int, watch: Stopwatch, message: str | None = None, reason: str | None = None
) -> Answer:
    return Answer(status, http_status, {"Server-Timing": watch.header()}, message, reason)


@dataclass(frozen=True)
class FlutterwaveCheck:
    """FLUTTERWAVE_VERIFY=1: where and with which key Flutterwave's verify endpoint is asked."""

    api_base: str
    secret_key: str


@dataclass(frozen=True, kw_only=True)
class PaymentWebhooks:
    """Everything the payment path needs, built once per process (and per reconfigure)."""

    store: Store  # the gate's claims and markers, the rejected-webhook list
    queue_redis: Store  # the settlement queue's Redis: queued audit rows, the outbox worker's signal
    queue: Queue
    secrets: Mapping[str, tuple[str, ...]]  # per provider: one, or the old and new while rotating
    claim_ttl_ms: int
    flutterwave: FlutterwaveCheck | None  # None unless FLUTTERWAVE_VERIFY=1
    # Flutterwave's API wherever FLUTTERWAVE_SECRET_KEY is set: its flat payload is looked up there
    flutterwave_api: FlutterwaveCheck | None = None
    account_field: str = ""  # PAYMENT_ACCOUNT_FIELD: the metadata key naming the wallet
    listening: Callable[[], bool] = lambda: True  # whether a committed event needs a wake
    # the wallets buyers are billed from, as the config cache knows them (None: ask the database)
    billed_wallets: Callable[[], Collection[str] | None] = lambda: None

    @classmethod
    def build(
        cls,
        cfg: Config,
        store: Store,
        queue_redis: Store,
        queue: Queue,
        billed_wallets: Callable[[], Collection[str] | None] = lambda: None,
    ) -> PaymentWebhooks:
        check = (
            FlutterwaveCheck(cfg.flutterwave_api_base, cfg.flutterwave_secret_key) if cfg.flutterwave_verify else None
        )
        api = FlutterwaveCheck(cfg.flutterwave_api_base, cfg.flutterwave_secret_key)
        return cls(
            store=store,
            queue_redis=queue_redis,
            queue=queue,
            secrets=cfg.secrets,
            claim_ttl_ms=cfg.payment_claim_ttl_ms,
            flutterwave=check,
            flutterwave_api=api if cfg.flutterwave_secret_key else None,
            account_field=cfg.payment_account_field,
            listening=Listening(bool(cfg.payment_events_url)),
            billed_wallets=billed_wallets,
        )

    def secrets_of(self, provider: str) -> tuple[str, ...]:
        """The provider's secrets; NotFound (404) for no such provider, 503 when it has none
        set. Cheap, so the view calls it before reading the body."""
        if provider not in signatures.VERIFIERS:
            raise NotFound(f"no payment provider {provider!r}")
        secrets = self.secrets.get(provider)
        if not secrets:
            raise FloodgateError(
                f"{provider} webhooks are not configured (secret unset)", status=503, code="provider_not_configured"
            )
        return secrets

    def receive(
        self, provider: str, raw: bytes, headers: Mapping[str, str], request_id: str | None, now: float
    ) -> Answer:
        """Verify, dedupe and act on one webhook; `now` is the wall clock the signature's
        timestamp is checked against. An answer that is an error (401, 400, 422, 503...) is
        raised as a FloodgateError, as the HTTP layer renders it."""
        watch = Stopwatch()
        secrets = self.secrets_of(provider)
        receipt = ledger.receipt(provider, raw, headers)
        try:
            signatures.verify(provider, raw, headers, secrets, now)
        except InvalidSignature:
            self._reject(receipt, request_id)
            raise
        watch.lap("verify")
        try:
            note = notifications.parse(provider, raw, self.account_field)
        except (InvalidPayload, InvalidJSON) as exc:
            ledger.write_call(receipt, exc.code, 400)
            raise
        watch.lap("parse")
        if isinstance(note, notifications.PaymentNotification) and note.by_reference and note.succeeded:
            note = self._look_up(note)
            watch.lap("confirm")
        if not isinstance(note, notifications.RefundNotification) and not note.succeeded:
            reason = note.reason or Ignored.EVENT_TYPE
            ledger.write_call(receipt, Verdict.IGNORED, 200, note, reason=reason)
            metrics.payment_ignored(provider, note.event_type, reason)
            return _answer(Verdict.IGNORED, 200, watch, reason=reason)
        entry = self._enter(note, receipt, request_id)
        watch.lap("dedupe")
        if entry.verdict != gate.CLAIMED:  # its audit row is queued: nothing waits for the database
            return _answer(Verdict(entry.verdict), gate.STATUS[entry.verdict], watch)
        assert entry.claim is not None  # claimed: the claim is ours
        try:
            outcome = self._act(note, receipt, entry.claim, watch)
        except PaymentNotFound as exc:
            # 409 for a refund of a payment not in the ledger yet: the provider retries it
            return _answer(Verdict.PAYMENT_NOT_FOUND, exc.status, watch, exc.message)
        if outcome.verdict in (Verdict.CREDITED, Verdict.DEBITED):
            self.wake_outbox(request_id)
        if outcome.reason is not None:
            metrics.payment_ignored(provider, note.event_type, outcome.reason)
        return _answer(outcome.verdict, 200, watch, reason=outcome.reason)

    def record_found(
        self,
        note: notifications.PaymentNotification | notifications.RefundNotification,
        receipt: Receipt,
        request_id: str | None,
    ) -> Verdict:
        """A payment the provider reconciliation found (reconcile.py), through the same claim,
        unique key and transaction as a webhook: whichever of the two comes first credits it,
        the other is a duplicate (or a reference_conflict, raised). IN_FLIGHT when a webhook
        holds the reference now (the next run looks again if it fails)."""
        entry = self._enter(note, receipt, request_id)
        if entry.verdict != gate.CLAIMED:
            return Verdict(entry.verdict)
        assert entry.claim is not None  # claimed: the claim is ours
        verdict = self._act(note, receipt, entry.claim, Stopwatch(), Source.RECONCILIATION).verdict
        if verdict in (Verdict.CREDITED, Verdict.DEBITED):
            self.wake_outbox(request_id)
        return verdict

    def _enter(
        self,
        note: notifications.PaymentNotification | notifications.RefundNotification,
        receipt: Receipt,
        request_id: str | None,
    ) -> gate.Entry:
        """The Redis front (payments/gate.py) for a webhook or a listed payment alike."""
        return gate.enter(
            self.store,
            self.queue_redis,
            self.queue,
            note,
            receipt,
            claim_ttl_ms=self.claim_ttl_ms,
            request_id=request_id,
        )

    def _act(
        self,
        note: notifications.PaymentNotification | notifications.RefundNotification,
        receipt: Receipt,
        claim: Claim,
        watch: Stopwatch,
        source: Source = Source.WEBHOOK,
    ) -> refunds.Outcome:
        """Move money going back (a refund, its failure, a dispute), or confirm and credit the
        payment (each commits, or raises: nothing kept), then release our claim, marking the
        reference processed if it was. Laps on `watch`: `confirm` (Flutterwave asked), `db_wait`
        (for a pooled connection), `ledger` (the transaction), `release` (the claim's, and the
        billed buyers' balances)."""
        processed = False
        outcome: refunds.Outcome
        try:
            # The database connection is taken for the money's transaction only: it goes back
            # before the claim's release and the answer (and is not held while Flutterwave is asked).
            if isinstance(note, notifications.RefundNotification):
                disputed = note.kind in (Motion.DISPUTE_WITHDRAWN, Motion.DISPUTE_REINSTATED)
                with borrowed():
                    watch.lap("db_wait")
                    outcome = (disputes if disputed else refunds).apply(note, receipt)
            else:
                # a listed payment comes from the provider's API itself
                if source is Source.WEBHOOK and self._confirm(note, receipt):
                    watch.lap("confirm")
                with borrowed():
                    watch.lap("db_wait")
                    outcome = refunds.Outcome(ledger.credit(note, receipt, source))
            processed = True
            watch.lap("ledger")
        finally:
            gate.finish(self.store, note, claim, processed)
        self._sync_balances(note)
        watch.lap("release")
        return outcome

    def _sync_balances(self, note: notifications.PaymentNotification | notifications.RefundNotification) -> None:
        """After a wallet moved: a buyer billed from it sees the new figure in its reservations
        (billing/balance.py). What the ledger holds is final: a failure here leaves the figure to
        the buyer's next change, its reconciliation or rebuild.

        A payment to a wallet no buyer is billed from, as the config cache says, costs nothing
        here (the database's own answer is an indexed read per payment). A buyer billed from it
        less than a check interval ago may miss the credit until its reconciliation: a balance
        held low, never high. A refund or dispute takes money away, so it always asks the database."""
        try:
            if isinstance(note, notifications.PaymentNotification):
                if note.customer is None or note.currency is None:
                    return
                billed = self.billed_wallets()
                if billed is None or balance.wallet_key(note.customer, note.currency) in billed:
                    balance.sync_wallet(self.store, note.customer, note.currency)
                return
            paid = Payment.get_or_none(Payment.provider == note.provider, Payment.reference == note.payment_reference)
            if paid is not None and paid.customer:
                balance.sync_wallet(self.store, paid.customer, paid.currency)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("billed buyers' balances not synced after %s %s: %s", note.provider, note.reference, exc)

    def _reject(self, receipt: Receipt, request_id: str | None) -> None:
        """A webhook that failed its signature check: counted, and its metadata pushed to the
        capped Redis list (rejected.py). It touches no database, so a flood of forgeries takes
        no connection from real payments. If Redis is down the 401 stands (the metric counts it)."""
        metrics.payment_rejected(receipt.provider, receipt.length)
        try:
            rejected.add(self.store.redis, receipt, request_id)
        # RedisClusterException: how a cluster pipeline says that no node answers
        except (*REDIS_DOWN, RedisClusterException) as exc:
            log.warning("%s webhook with an invalid signature not listed, Redis unavailable: %s", receipt.provider, exc)

    def _look_up(self, note: notifications.PaymentNotification) -> notifications.PaymentNotification:
        """A payment its webhook names by reference only (Flutterwave's flat payload): the one
        Flutterwave's verify-by-reference answers, read as its v3 webhook would carry it; else
        the same notice, ignored (`not_successful`: Flutterwave knows no such successful
        payment; `unverifiable`: no API key, or an answer that cannot be credited). Unavailable
        (503) when Flutterwave cannot be asked: it sends the webhook again later."""
        api, ref = self.flutterwave_api, note.reference
        if api is None or ref is None:
            return dataclasses.replace(note, succeeded=False, reason=Ignored.UNVERIFIABLE)
        found = flutterwave.by_reference(ref, api.api_base, api.secret_key)
        if found is None:
            return dataclasses.replace(note, succeeded=False, reason=Ignored.NOT_SUCCESSFUL)
        try:
            full = notifications.parse("flutterwave", found, self.account_field)
        except (InvalidPayload, InvalidJSON) as exc:
            log.warning("Flutterwave's answer for %s cannot be credited: %s", ref, exc)
            return dataclasses.replace(note, succeeded=False, reason=Ignored.UNVERIFIABLE)
        assert isinstance(full, notifications.PaymentNotification)  # a charge.completed body
        return dataclasses.replace(full, event_type=note.event_type, by_reference=True)

    def _confirm(self, note: notifications.PaymentNotification, receipt: Receipt) -> bool:
        """FLUTTERWAVE_VERIFY=1: ask Flutterwave whether this payment happened as the webhook says
        (its verif-hash is a static secret that signs nothing). 422 and flagged when it did not;
        503 when Flutterwave cannot be asked, so that it sends the webhook again later. Whether
        it was asked."""
        if note.provider != "flutterwave" or self.flutterwave is None or note.by_reference:
            return False  # a payment looked up by reference is Flutterwave's own answer already
        try:
            flutterwave.confirm(note, self.flutterwave.api_base, self.flutterwave.secret_key)
        except NotConfirmed as exc:
            ledger.record_unconfirmed(receipt, note, exc.message)
            raise
        return True

    def assign(self, provider: str, reference: str, customer: object) -> Payment:
        """Credit the unattributed payment to the wallet `customer`, exactly once (ledger.assign):
        400 invalid_assign for no wallet, 409 already_assigned; a billed buyer's balance and the
        outbox told. (A view calls `find` first: 404 before the body is read.)"""
        key = notifications.wallet(customer)
        if key is None:
            raise ValidationError("invalid_assign", "customer", "must be a wallet: 1 to 254 characters without spaces")
        payment = ledger.assign(provider, reference, key)
        balance.sync_wallet(self.store, key, payment.currency)  # a top-up of a billed buyer, maybe
        self.wake_outbox(None)
        return payment

    def wake_outbox(self, request_id: str | None) -> None:
        """A credit or debit committed its event: wake the worker that sends it, when an
        endpoint may want it (one Redis round trip saved per payment when none does)."""
        if self.listening():
            outbox_queue.wake(self.queue_redis.redis, self.queue, request_id)


def find(provider: str, reference: str) -> Payment:
    """The payment `reference` of `provider`; NotFound otherwise."""
    row = None
    if provider in signatures.VERIFIERS and len(reference) <= 128:
        row = Payment.get_or_none(Payment.provider == provider, Payment.reference == reference)
    if row is None:
        raise NotFound(f"no {provider} payment {reference!r}")
    return row
