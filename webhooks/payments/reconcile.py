"""Provider reconciliation: the payments whose webhook never came. Each configured provider's
successful payments in the lookback window (providers/payment_lists.py) go through the same claim, unique key
and transaction as a webhook (`PaymentWebhooks.record_found`), so either credits a payment
once; one run at a time (a Redis lock). docs/payments.md "Provider reconciliation"."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from webhooks import metrics
from webhooks.errors import FloodgateError, PaymentNotFound, ReferenceConflict, RefundExceedsPayment
from webhooks.payments.ledger import BODY_CAP, Receipt
from webhooks.payments.providers import notifications
from webhooks.payments.providers.listing import Lister, ProviderError
from webhooks.payments.providers.payment_lists import going_back
from webhooks.payments.states import Verdict
from webhooks.payments.webhook import PaymentWebhooks
from webhooks.storage.live import claims, keys
from webhooks.storage.records.models import Payment, utcnow

log = logging.getLogger(__name__)

RECEIPT_HEADERS = json.dumps({"source": "reconciliation"})
LOCK_TTL_MS = 15 * 60 * 1000  # a run that died leaves the lock this long at most
BUDGET_S = 10 * 60.0  # a run stops reading after this long; the next run takes the window again
RECOVERED = (Verdict.CREDITED, Verdict.UNATTRIBUTED)


@dataclass
class ProviderRun:
    """What one provider's run read and did (logged, counted in metrics, printed by the CLI)."""

    provider: str
    pages: int = 0
    calls: int = 0
    listed: int = 0  # successful payments the provider listed
    known: int = 0  # already in the ledger
    recovered: int = 0  # missing, now credited (or recorded unattributed)
    missing: int = 0  # missing and not recovered by this run: a dry run, or a webhook holds it now
    conflicts: int = 0  # known with another amount, currency or wallet: flagged, nothing credited
    unreadable: int = 0  # a listed payment its provider's shape did not give (logged)
    moved: int = 0  # refunds and disputes whose webhook never came, now debited or credited
    back_pages: int = 0  # pages of refunds and disputes read (`pages`: of payments)
    error: str | None = None  # why the run stopped early, if it did

    def counts(self) -> dict[str, int]:
        return {
            "pages": self.pages,
            "calls": self.calls,
            "listed": self.listed,
            "recovered": self.recovered,
            "moved": self.moved,
            "errors": int(self.error is not None),
        }


@dataclass
class Run:
    providers: list[ProviderRun] = field(default_factory=list)
    busy: bool = False  # another run holds the lock: this one did nothing


def run(
    hooks: PaymentWebhooks,
    listers: dict[str, Lister],
    since: datetime,
    until: datetime | None = None,
    *,
    dry_run: bool = False,
    progress: Callable[[str], None] = log.info,
) -> Run:
    """Reconcile each of `listers` over [since, until] (until: now). With `dry_run` nothing is
    written: the missing payments are only counted."""
    until = until or datetime.now(timezone.utc)
    lock, _holder = claims.claim(hooks.store, keys.PROVIDER_RECONCILE_LOCK, LOCK_TTL_MS)
    if lock is None:
        progress("another provider reconciliation is running: nothing done")
        return Run(busy=True)
    deadline = time.monotonic() + BUDGET_S
    try:
        done = Run()
        for provider, lister in listers.items():
            result = _run_provider(hooks, lister, since, until, dry_run=dry_run, deadline=deadline, progress=progress)
            done.providers.append(result)
            if not dry_run:
                metrics.provider_reconciled(provider, result.counts())
        return done
    finally:
        claims.release(hooks.store, lock)


def _run_provider(
    hooks: PaymentWebhooks,
    lister: Lister,
    since: datetime,
    until: datetime,
    *,
    dry_run: bool,
    deadline: float,
    progress: Callable[[str], None],
) -> ProviderRun:
    result = ProviderRun(lister.provider)
    progress(f"{lister.provider}: listing successful payments {since.isoformat()} .. {until.isoformat()}")
    try:
        for page in lister.pages(since, until):
            result.pages, result.calls = result.pages + 1, result.calls + page.calls
            _settle_page(hooks, lister.provider, page.bodies, dry_run, result)
            progress(
                f"{lister.provider}: page {page.number} read ({len(page.bodies)} payments); so far "
                f"{result.listed} listed, {result.known} known, {result.recovered} recovered, {result.missing} missing"
            )
            if time.monotonic() > deadline:
                result.error = f"time budget of {BUDGET_S:.0f} s spent: the next run reads the window again"
                break
        back = going_back(lister)
        if back is not None and result.error is None:
            progress(f"{lister.provider}: listing refunds and disputes")
            for page in back.pages(since, until):
                result.back_pages, result.calls = result.back_pages + 1, result.calls + page.calls
                _settle_page(hooks, lister.provider, page.bodies, dry_run, result)
                if time.monotonic() > deadline:
                    result.error = f"time budget of {BUDGET_S:.0f} s spent: the next run reads the window again"
                    break
    except ProviderError as exc:
        result.error = str(exc)
    if result.error:
        log.warning("%s reconciliation stopped early: %s", lister.provider, result.error)
    progress(
        f"{lister.provider}: {result.pages} page(s), {result.calls} call(s): {result.listed} listed, "
        f"{result.known} known, {result.recovered} recovered, {result.moved} refunds/disputes moved, "
        f"{result.missing} missing, {result.conflicts} conflict(s), {result.unreadable} unreadable"
        + (f"; stopped early: {result.error}" if result.error else "")
    )
    return result


def _settle_page(
    hooks: PaymentWebhooks, provider: str, bodies: list[bytes], dry_run: bool, result: ProviderRun
) -> None:
    """Credit what the ledger does not have of one whole page; what it has costs one query."""
    found, back = _read_page(provider, bodies, hooks.account_field, result)
    result.listed += len(found)
    known = _known(provider, [e.reference for e, _ in found if e.reference])
    for note, body in found:
        if note.reference in known:
            result.known += 1
        elif dry_run:
            result.missing += 1
        else:
            _credit(hooks, provider, note, body, result)
    for motion, body in back:  # after the page's payments: a refund of one of them finds it
        _move(hooks, provider, motion, body, dry_run=dry_run, result=result)


def _read_page(
    provider: str, bodies: list[bytes], account_field: str, result: ProviderRun
) -> tuple[list[tuple[notifications.PaymentNotification, bytes]], list[tuple[notifications.RefundNotification, bytes]]]:
    """A page's successful payments and its refunds or disputes, each with its body; what
    cannot be read is counted and logged."""
    found: list[tuple[notifications.PaymentNotification, bytes]] = []
    back: list[tuple[notifications.RefundNotification, bytes]] = []
    for body in bodies:
        try:
            note = notifications.parse(provider, body, account_field)
        except FloodgateError as exc:  # InvalidPayload, InvalidJSON
            result.unreadable += 1
            log.error("%s listed a payment that cannot be read (%s): left for review", provider, exc.message)
            continue
        if isinstance(note, notifications.RefundNotification):
            back.append((note, body))
        elif note.succeeded and note.reference:
            found.append((note, body))
    return found, back


def _credit(
    hooks: PaymentWebhooks, provider: str, note: notifications.PaymentNotification, body: bytes, result: ProviderRun
) -> None:
    """A listed payment the ledger lacks, through the webhook's own claim and transaction."""
    try:
        verdict = hooks.record_found(note, _receipt(provider, body), None)
    except ReferenceConflict:
        result.conflicts += 1
        return
    if verdict in RECOVERED:
        result.recovered += 1
        log.warning("%s payment %s recovered by reconciliation (%s)", provider, note.reference, verdict)
    elif verdict == Verdict.DUPLICATE:
        result.known += 1
    else:  # in flight: a webhook is crediting it right now
        result.missing += 1


def _move(
    hooks: PaymentWebhooks,
    provider: str,
    note: notifications.RefundNotification,
    body: bytes,
    *,
    dry_run: bool,
    result: ProviderRun,
) -> None:
    """A listed refund or dispute, through the webhook's own claim and transaction: whichever of
    the two comes first moves the wallet, the other is a duplicate."""
    result.listed += 1
    if dry_run:
        result.missing += 1
        return
    try:
        verdict = hooks.record_found(note, _receipt(provider, body), None)
    except PaymentNotFound:  # its payment is not in the ledger yet: the next run tries again
        result.missing += 1
        return
    except (ReferenceConflict, RefundExceedsPayment):
        result.conflicts += 1
        return
    except FloodgateError as exc:  # InvalidPayload: an amount the payment's currency refuses
        result.unreadable += 1
        log.error("%s listed a %s that cannot be applied (%s)", provider, note.kind, exc.message)
        return
    if verdict in (Verdict.DEBITED, Verdict.CREDITED):
        result.moved += 1
        log.warning("%s %s %s applied by reconciliation (%s)", provider, note.kind, note.reference, verdict)
    elif verdict == Verdict.IN_FLIGHT:
        result.missing += 1
    else:
        result.known += 1


def _known(provider: str, references: list[str]) -> set[str]:
    if not references:
        return set()
    rows = Payment.select(Payment.reference).where(Payment.provider == provider, Payment.reference.in_(references))
    return {row.reference for row in rows}


def _receipt(provider: str, body: bytes) -> Receipt:
    """What the ledger keeps of a listed payment, as of a webhook: the body it was read from."""
    return Receipt(
        provider=provider,
        headers=RECEIPT_HEADERS,
        body=body[:BODY_CAP],
        truncated=len(body) > BODY_CAP,
        received_at=utcnow(),
        length=len(body),
        sha256=hashlib.sha256(body).hexdigest(),
    )


def window(lookback_s: int, since: datetime | None = None) -> datetime:
    """The start of a run's window: `since`, else `lookback_s` ago."""
    return since or datetime.now(timezone.utc) - timedelta(seconds=lookback_s)
