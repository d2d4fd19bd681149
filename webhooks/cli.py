"""Operator commands: `flask --app wsgi <group> <command>`, or `scripts/floodgate <group>
<command>` (main: the same commands under Floodgate's name and help); each has --help.

Every command exits 0 on success and non-zero with one "Error: ..." line on bad input (2 for
a malformed command line, 1 for anything else), including a database or Redis that does not
answer. Imports validate with the admin API's own parse functions, are all or nothing, and save
through the admin API's own services (leads/rules/buyer_service.py, publisher_service.py).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

import click
from flask import Flask
from flask.cli import AppGroup, FlaskGroup, ScriptInfo

from webhooks import services
from webhooks.errors import Conflict, ValidationError
from webhooks.formats.validate import is_id
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.records.db import UNAVAILABLE_ERRORS


class _Group(AppGroup):
    """A command group whose commands turn an unreachable backend into a clear error."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UNAVAILABLE_ERRORS as exc:
            raise click.ClickException(f"the database is unavailable: {exc}") from None
        except REDIS_DOWN as exc:
            raise click.ClickException(f"Redis is unavailable: {exc}") from None


db_cli = _Group("db", help="Ledger schema.")
caps_cli = _Group("caps", help="Cap counters in Redis.")
settle_cli = _Group("settlements", help="The queue of lead settlements.")
buyers_cli = _Group("buyers", help="Buyers: export, import, caps and usage, recent leads.")
publishers_cli = _Group("publishers", help="Publishers: export, import, replay memory.")
leads_cli = _Group("leads", help="Leads in the ledger.")
events_cli = _Group("events", help="Events to the applications' endpoints (PAYMENT_EVENTS_URL among them): the outbox.")
payments_cli = _Group("payments", help="Payments: reconciliation with the providers' own lists.")
suppression_cli = _Group("suppression", help="Suppression lists: their entries in the database and Redis.")


def _id_argument(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """click callback: an id argument must look like one (usage error, exit 2, otherwise)."""
    if not is_id(value):
        raise click.BadParameter("must match [A-Za-z0-9._-]{1,64}")
    return value


def _progress(items: list[Any], label: str) -> Any:
    """A progress bar on stderr (stdout may be carrying JSON)."""
    return click.progressbar(items, label=label, file=sys.stderr, show_pos=True)


@db_cli.command("upgrade", help="Apply the numbered sql/ migrations not applied yet (idempotent).")
def upgrade_command() -> None:
    from webhooks.storage.records.migrate import upgrade

    applied = upgrade(echo=click.echo)
    click.echo(f"applied {len(applied)} migration(s)" if applied else "nothing to apply")


@suppression_cli.command(
    "rehash",
    help="Rewrite plain (hash none) lists written before sql/021 as keyed hashes under SUPPRESSION_KEY, "
    "then load them into Redis again (idempotent; run after `db upgrade`). Default: every plain list.",
)
@click.argument("list_ids", nargs=-1, callback=lambda _c, _p, ids: [_id_argument(_c, _p, i) for i in ids])
def rehash_command(list_ids: list[str]) -> None:
    from webhooks.leads.rules.suppression_rehash import plain_lists, rehash

    svc = services.current()
    key = svc.config.suppression_key.encode()
    for list_id in list_ids or plain_lists():
        try:
            rewritten = rehash(svc.store, list_id, key)
        except Conflict as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"{list_id}: {rewritten} entries rewritten, loaded into Redis")


@caps_cli.command(
    "reconcile",
    help="Compare every active buyer's counters with the ledger now and correct drift (what the hourly job does).",
)
def reconcile_command() -> None:
    from webhooks.caps.reconcile import reconcile_all
    from webhooks.leads.rules.catalog import load_snapshot

    svc = services.current()
    drifts = reconcile_all(svc.store, svc.queue_redis.redis, load_snapshot(None).buyers)
    for d in drifts:
        click.echo(f"{d['buyer_id']} {d['cap']} {d['window']}: counter {d['counter']} -> {d['expected']}")
    click.echo(f"{len(drifts)} drift(s) corrected")


@settle_cli.command(
    "requeue",
    help="Requeue settlement jobs that ran out of retries (RQ's failed registry), e.g. after a long database outage.",
)
def requeue_command() -> None:
    from rq.registry import FailedJobRegistry

    q = services.current().queue
    registry = FailedJobRegistry(queue=q)
    ids = registry.get_job_ids()
    with _progress(ids, "requeueing") as bar:
        for job_id in bar:
            registry.requeue(job_id)
    click.echo(f"requeued {len(ids)} job(s) on {q.name}")


@settle_cli.command("status", help="Pending settlements and the state of the settlement queue.")
def status_command() -> None:
    from rq.registry import FailedJobRegistry, StartedJobRegistry

    from webhooks.storage.live import keys

    q = services.current().queue
    status = {
        "pending_settlements": services.current().queue_redis.redis.llen(keys.SETTLE_PENDING),
        "queued_jobs": q.count,
        "running_jobs": StartedJobRegistry(queue=q).count,
        "failed_jobs": FailedJobRegistry(queue=q).count,
    }
    json.dump(status, sys.stdout, indent=2)
    click.echo()


@events_cli.command(
    "status",
    help="Deliveries not yet made: pending (being retried, or held behind an earlier event of "
    "the same entity) and failed (given up), in all and per endpoint, and the events waiting "
    "for fan-out.",
)
def events_status() -> None:
    from webhooks.events import log as events_log

    per_endpoint = events_log.backlog()
    status = {
        "pending": sum(c["pending"] for c in per_endpoint.values()),
        "failed": sum(c["failed"] for c in per_endpoint.values()),
        "endpoints": per_endpoint,
        "not_fanned_out": events_log.not_fanned_out(),
    }
    json.dump(status, sys.stdout, indent=2)
    click.echo()


@events_cli.command(
    "retry",
    help="Give every failed event delivery a new round of attempts, due now (each entity's "
    "events still go out in order per endpoint), and wake the worker.",
)
def events_retry() -> None:
    from webhooks.events import log as events_log
    from webhooks.storage.live import outbox_queue

    requeued = events_log.retry_failed()
    if requeued:
        svc = services.current()
        outbox_queue.signal(svc.queue_redis.redis, svc.queue)
    click.echo(f"requeued {requeued} failed event deliveries")


@payments_cli.command(
    "reconcile",
    help="Credit the successful payments each configured provider lists and the ledger lacks "
    "(their webhook never came), through the webhook's exactly-once path. Progress on stderr, "
    "a summary per provider on stdout.",
)
@click.option(
    "--provider",
    type=click.Choice(["paystack", "flutterwave", "monnify", "stripe", "interswitch"]),
    help="Only this provider (default: every configured one).",
)
@click.option(
    "--since",
    type=click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%SZ"]),
    help="Start of the window, UTC (default: PROVIDER_RECONCILE_LOOKBACK_S ago).",
)
@click.option("--dry-run", is_flag=True, help="Count the missing payments, credit nothing; say what is not reconciled.")
def reconcile_payments(provider: str | None, since: datetime | None, dry_run: bool) -> None:
    from webhooks.payments import reconcile
    from webhooks.payments.providers import payment_lists

    svc = services.current()
    listers = payment_lists.listers(svc.config)
    unconfigured = payment_lists.unconfigured(svc.config)
    if provider is not None:
        if provider not in listers:
            raise click.ClickException(f"{provider} is not reconciled: {unconfigured.get(provider, 'not configured')}")
        listers = {provider: listers[provider]}
    for name, why in unconfigured.items():
        if provider in (None, name):
            click.echo(f"{name}: not reconciled ({why})", err=True)
    start = reconcile.window(
        svc.config.provider_reconcile_lookback_s, since.replace(tzinfo=timezone.utc) if since else None
    )
    done = reconcile.run(
        svc.payments, listers, start, dry_run=dry_run, progress=lambda line: click.echo(line, err=True)
    )
    if done.busy:
        raise click.ClickException("another provider reconciliation is running; try again when it ends")
    json.dump([vars(p) for p in done.providers], sys.stdout, indent=2)
    click.echo()
    if any(p.error for p in done.providers):
        raise click.ClickException(
            "a provider's run stopped early (see its error): nothing of its failed page was credited"
        )


# --- import / export -------------------------------------------------------------------------


def _write(entries: list[dict[str, Any]], output: Any) -> None:
    json.dump(entries, output, indent=2)
    output.write("\n")


def _read_entries(file: Any, what: str) -> list[dict[str, Any]]:
    """The JSON list an export wrote: objects with a valid, unique `id` each."""
    try:
        entries = json.load(file)
    except (ValueError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{file.name} is not valid JSON: {exc}") from None
    if not isinstance(entries, list):
        raise click.ClickException(f"{file.name} must hold a JSON list of {what} (as `{what} export` writes)")
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not is_id(entry.get("id")):
            raise click.ClickException(f'{what}[{i}]: must be an object with an "id" matching [A-Za-z0-9._-]{{1,64}}')
        if entry["id"] in seen:
            raise click.ClickException(f"{what}[{i}]: id {entry['id']!r} appears twice")
        seen.add(entry["id"])
    return entries


def _import(
    entries: list[dict[str, Any]],
    what: str,
    parse: Callable[[Any], dict[str, Any]],
    save: Callable[[str, dict[str, Any]], Any],
    hint: Callable[[ValidationError], str] = lambda e: "",
) -> list[Any]:
    """Validate every entry, then save them all in one transaction (all or nothing); return
    what `save` returned for each."""
    from webhooks.storage.records.db import db

    def checked(i: int, action: Callable[..., Any], *args: Any) -> Any:
        try:
            return action(*args)
        except ValidationError as exc:
            raise click.ClickException(f"{what}[{i}] ({entries[i]['id']}): {exc.message}{hint(exc)}") from None

    parsed = [checked(i, parse, entry) for i, entry in enumerate(entries)]
    results = []
    with db.atomic(), _progress(list(enumerate(parsed)), f"importing {what}") as bar:
        for i, fields in bar:
            results.append(checked(i, save, entries[i]["id"], fields))
    return results


@buyers_cli.command(
    "export",
    help="Write every buyer (deleted ones excepted) as a JSON list, in "
    "the admin API's form; `buyers import` reads it back.",
)
@click.option("-o", "--output", type=click.File("w"), default="-", help="File to write (default: stdout).")
def export_buyers(output: Any) -> None:
    from webhooks.leads.rules.buyers import to_json
    from webhooks.storage.records.models import Buyer

    rows = list(Buyer.select().where(Buyer.deleted_at.is_null()).order_by(Buyer.id))
    with _progress(rows, "exporting buyers") as bar:
        entries = [to_json(row) for row in bar]
    _write(entries, output)
    click.echo(f"exported {len(entries)} buyer(s)", err=True)


@buyers_cli.command(
    "import",
    help="Create or replace the buyers of FILE (a JSON list as `buyers "
    'export` writes; each needs an "id"). Every buyer is validated '
    "as the admin API does first; nothing is saved if one is invalid. "
    "Secrets an export shows redacted (header values, secret URL query values) "
    "keep those of the buyer of the same id here; for a new buyer, give them in full.",
)
@click.argument("file", type=click.File("r"))
def import_buyers(file: Any) -> None:
    from webhooks.leads.rules import buyer_service, buyers
    from webhooks.storage.records.models import Buyer

    def parse(entry: dict[str, Any]) -> dict[str, Any]:  # as a PUT does: the redacted form keeps the stored secret
        return buyers.parse(entry, Buyer.get_or_none(Buyer.id == entry["id"]))

    store = services.current().store
    saved = _import(_read_entries(file, "buyers"), "buyers", parse, lambda i, f: buyer_service.write(store, i, f))
    buyer_service.announce(store, saved)  # as a PUT does, once the whole import committed
    click.echo(f"imported {len(saved)} buyer(s) ({sum(c for _, c in saved)} new)")


def _publisher_key_hint(exc: ValidationError) -> str:
    if exc.field == "api_key":
        return (
            ' (exports carry no API keys: only their hash is stored; add each publisher\'s "api_key" before importing)'
        )
    return ""


@publishers_cli.command(
    "export", help="Write every publisher as a JSON list. API keys are not exported: only a hash of each is stored."
)
@click.option("-o", "--output", type=click.File("w"), default="-", help="File to write (default: stdout).")
def export_publishers(output: Any) -> None:
    from webhooks.leads.rules.publishers import to_json
    from webhooks.storage.records.models import Publisher

    rows = list(Publisher.select().order_by(Publisher.id))
    with _progress(rows, "exporting publishers") as bar:
        entries = [to_json(row) for row in bar]
    _write(entries, output)
    click.echo(
        f"exported {len(entries)} publisher(s); API keys are not included (only a hash is "
        'stored): add "api_key" to each before importing',
        err=True,
    )


@publishers_cli.command(
    "import",
    help="Create or replace the publishers of FILE (a JSON list; each "
    'needs an "id" and its "api_key"). Validated as the admin '
    "API does; nothing is saved if one is invalid.",
)
@click.argument("file", type=click.File("r"))
def import_publishers(file: Any) -> None:
    from webhooks.leads.rules import publisher_service, publishers

    saved = _import(
        _read_entries(file, "publishers"), "publishers", publishers.parse, publishers.save, _publisher_key_hint
    )
    publisher_service.announce(services.current().store, saved)  # as a PUT does, once all committed
    click.echo(f"imported {len(saved)} publisher(s)")


@publishers_cli.command(
    "trust-replay-memory",
    help="Mark every publisher's lead answers as all held by Redis, so that no lead "
    'of theirs reads the ledger before it is routed (docs/leads.md "After Redis '
    'lost its data"). Run it once when upgrading to this version, while Redis '
    "has kept its data since the publishers' first leads; a mark a real data "
    "loss left is kept unless --force.",
)
@click.option("--force", is_flag=True, help="Also replace marks that say when Redis lost its data.")
def trust_replay_memory(force: bool) -> None:
    from webhooks.storage.live import keys
    from webhooks.storage.records.models import Publisher

    r = services.current().store.redis
    ids = [p.id for p in Publisher.select(Publisher.id).order_by(Publisher.id)]
    marked = sum(1 for pid in ids if r.set(keys.lead_memory(pid), "0", nx=not force))
    click.echo(f"{marked} of {len(ids)} publisher(s) marked" + ("" if force else " (marks already set were kept)"))


# --- reading one buyer ------------------------------------------------------------------------


def _buyer_row(buyer_id: str) -> Any:
    from webhooks.storage.records.models import Buyer

    row = Buyer.get_or_none(Buyer.id == buyer_id)
    if row is None:
        raise click.ClickException(f"no buyer {buyer_id!r}")
    return row


def _table(rows: Iterable[Iterable[Any]]) -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


@buyers_cli.command(
    "show", help="A buyer's caps, their use in the current windows (the buyer's local time) and its circuit breaker."
)
@click.argument("buyer_id", callback=_id_argument)
def show_buyer(buyer_id: str) -> None:
    from webhooks.caps import leases
    from webhooks.caps.breaker import breakers
    from webhooks.leads.rules.buyers import BuyerRule

    row = _buyer_row(buyer_id)
    r = services.current().store.redis
    state = "deleted" if row.deleted_at else "active" if row.active else "inactive"
    click.echo(
        f"{row.id}: {row.name} ({state}), price {row.price:.2f}, priority {row.priority}, time zone {row.timezone}"
    )
    breaker = breakers(r, [row.id])[row.id]
    click.echo(f"breaker: {breaker.state.replace('_', '-')} ({breaker.failures} consecutive failure(s))")
    for publisher, state in breaker.publishers:
        click.echo(f"breaker for publisher {publisher}: {state.replace('_', '-')}")
    usage = leases.usage(r, BuyerRule.from_row(row), datetime.now(timezone.utc))
    if not usage:
        click.echo("caps: none (unlimited)")
        return
    _table(
        [("cap", "window start", "used", "limit")]
        + [(cap, u["window_start"], u["used"], u["limit"]) for cap, u in usage.items()]
    )


@buyers_cli.command(
    "leads",
    help="The leads most recently offered to a buyer, newest first: this "
    "buyer's outcome, and the lead's final status and buyer.",
)
@click.argument("buyer_id", callback=_id_argument)
@click.option("-n", "--limit", type=click.IntRange(1, 1000), default=20, show_default=True, help="How many leads.")
def buyer_leads(buyer_id: str, limit: int) -> None:
    from peewee import Tuple

    from webhooks.storage.records.models import Lead, LeadAttempt

    _buyer_row(buyer_id)
    attempts = list(
        LeadAttempt.select().where(LeadAttempt.buyer_id == buyer_id).order_by(LeadAttempt.id.desc()).limit(limit)
    )
    if not attempts:
        click.echo(f"no leads offered to {buyer_id!r} in the ledger")
        return
    pairs = [(a.publisher_id, a.lead_id) for a in attempts]
    leads = {
        (lead.publisher_id, lead.lead_id): lead
        for lead in Lead.select().where(Tuple(Lead.publisher_id, Lead.lead_id).in_(pairs))
    }
    rows: list[tuple[Any, ...]] = [
        ("received (UTC)", "publisher", "lead", "outcome", "ms", "lead status", "sold to", "price")
    ]
    # The last settled, newest received first (one settlement batch holds leads in any order).
    attempts.sort(key=lambda a: leads[(a.publisher_id, a.lead_id)].received_at, reverse=True)
    for a in attempts:
        lead = leads[(a.publisher_id, a.lead_id)]
        rows.append(
            (
                lead.received_at.isoformat(timespec="seconds"),
                a.publisher_id,
                a.lead_id,
                a.outcome,
                a.ms,
                lead.status,
                lead.buyer_id or "-",
                "-" if lead.price is None else f"{lead.price:.2f}",
            )
        )
    _table(rows)


@leads_cli.command(
    "unknown",
    help="Leads flagged for review, newest first: a buyer may hold each without "
    "it being sold (its routing died mid-offer and the buyer did not "
    "confirm it when offered it again). Settle each with the buyer.",
)
@click.option("-n", "--limit", type=click.IntRange(1, 10000), default=50, show_default=True, help="How many leads.")
def unknown_leads(limit: int) -> None:
    from webhooks.leads.accounting.ledger import flagged, lead_view

    rows = [lead_view(lead) for lead in flagged(limit)]
    if not rows:
        click.echo("no leads flagged for review")
        return
    _table(
        [("received (UTC)", "publisher", "lead", "buyer (unknown)", "attempts")]
        + [
            (
                r["received_at"][:19],
                r["publisher_id"],
                r["lead_id"],
                ",".join(a["buyer_id"] for a in r["attempts"] if a["outcome"] == "unknown"),
                " ".join(f"{a['buyer_id']}:{a['outcome']}" for a in r["attempts"]),
            )
            for r in rows
        ]
    )


@leads_cli.command(
    "return",
    help="Return the sold leads of FILE, a CSV with a header line and the columns "
    "lead_id, publisher_id (may be empty when one publisher used the id) and "
    "reason (optional), as POST /v1/admin/leads/<id>/return does for each.",
)
@click.argument("file", type=click.File("r"))
def return_leads(file: Any) -> None:
    import csv

    from webhooks.errors import FloodgateError
    from webhooks.leads.accounting import return_service

    rows = list(csv.DictReader(file))
    if rows and "lead_id" not in rows[0]:
        raise click.ClickException(f"{file.name}: the header must name a lead_id column")
    svc = services.current()
    results: dict[str, int] = {}
    problems = []
    with _progress(rows, "returning leads") as bar:
        for n, row in enumerate(bar, 2):
            lead_id, publisher_id = (row.get("lead_id") or "").strip(), (row.get("publisher_id") or "").strip() or None
            if not is_id(lead_id) or (publisher_id is not None and not is_id(publisher_id)):
                problems.append(f"line {n}: not a lead id / publisher id")
                results["invalid"] = results.get("invalid", 0) + 1
                continue
            try:
                done = return_service.return_now(  # as POST /v1/admin/leads/<id>/return does
                    svc.store,
                    queue_redis=svc.queue_redis,
                    queue=svc.queue,
                    lead_id=lead_id,
                    publisher_id=publisher_id,
                    reason=(row.get("reason") or "").strip() or None,
                    buyer_id=(row.get("buyer_id") or "").strip() or None,
                    actor="cli",
                )
                outcome = "return_pending" if done.pending else "returned"
                results[outcome] = results.get(outcome, 0) + 1
            except FloodgateError as exc:
                problems.append(f"line {n} ({lead_id}): {exc.code}: {exc.message}")
                results[exc.code] = results.get(exc.code, 0) + 1
    for problem in problems:
        click.echo(problem, err=True)
    click.echo(", ".join(f"{count} {what}" for what, count in sorted(results.items())) or "no rows")
    if problems:
        sys.exit(1)


@leads_cli.command(
    "purge",
    help="Empty the bodies of leads kept past LEAD_BODY_RETENTION_DAYS (unsold and test leads) "
    "and SOLD_LEAD_BODY_RETENTION_DAYS (sold ones) now, as the hourly job does, until none is "
    "left; the ledger's figures stay. Safe to run beside the job.",
)
@click.option("--chunk", type=click.IntRange(1, 10000), default=500, show_default=True, help="Leads per statement.")
def purge_leads(chunk: int) -> None:
    from webhooks.leads.accounting import ledger
    from webhooks.storage.records.db import db

    svc = services.current()
    groups = ledger.kept(svc.config.lead_body_retention_days, svc.config.sold_lead_body_retention_days)

    def progress(group: str, emptied: int, mark: ledger.Mark) -> None:
        click.echo(f"{group}: {emptied} emptied, up to leads received {mark.received_at.isoformat()}Z", err=True)

    with db.connection_context():
        emptied = ledger.purge_bodies(
            svc.queue_redis.redis,
            groups,
            datetime.now(timezone.utc),
            chunk=chunk,
            time_budget_s=float("inf"),
            progress=progress,
        )
    click.echo(", ".join(f"{count} {group} lead bodies emptied" for group, count in emptied.items()))


@leads_cli.command(
    "index",
    help="Write the e-mail and phone digests the lead search finds leads by (sql/030) for the "
    "leads settled before them that still have their body, under this process's SUPPRESSION_KEY. "
    "Safe to run again and beside settlement.",
)
@click.option("--chunk", type=click.IntRange(1, 10000), default=500, show_default=True, help="Leads per transaction.")
def index_leads(chunk: int) -> None:
    from webhooks.leads.accounting import lookup
    from webhooks.storage.records.db import db

    key = services.current().config.suppression_key.encode()
    written, after = 0, 0
    with db.connection_context():
        while True:
            n, last = lookup.backfill_chunk(key, after, chunk)
            if last is None:
                break
            written, after = written + n, last
            click.echo(f"{written} indexed, up to lead row {last}", err=True)
    click.echo(f"{written} leads indexed")


@leads_cli.command(
    "rebuild-report-days",
    help="Make the leads report's days (lead_stats_days, sql/034) again from its hours, from "
    "SINCE to UNTIL (UTC days; UNTIL today when not given): after a release applied sql/034 while "
    "processes of the release before it were still settling (their counts reached the hours "
    "only). Safe to run again and beside settlement.",
)
@click.argument("since", type=click.DateTime(formats=["%Y-%m-%d"]))
@click.option("--until", type=click.DateTime(formats=["%Y-%m-%d"]), default=None, help="The last day.")
def rebuild_report_days(since: datetime, until: datetime | None) -> None:
    from datetime import timedelta

    from webhooks.leads.accounting import reports
    from webhooks.storage.records.db import db

    day = since.date()
    last = until.date() if until is not None else datetime.now(timezone.utc).date()
    if not 0 <= (last - day).days < reports.MAX_DAYS:
        raise click.BadParameter(f"from 1 to {reports.MAX_DAYS} days, SINCE first", param_hint="SINCE, --until")
    made = 0
    with db.connection_context():
        while day <= last:
            made += reports.rebuild_day(day)
            click.echo(f"{day.isoformat()}: made again", err=True)
            day += timedelta(days=1)
    click.echo(f"{made} rows of the report's days made again")


@click.command(
    "demo-buyer",
    help="Run a buyer to try Floodgate with: it accepts every lead posted to "
    "http://HOST:PORT/<name> and bids on pings at /<name>/ping. Ctrl-C stops it.",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=9100, show_default=True)
def demo_buyer(host: str, port: int) -> None:
    from webhooks import demo_buyer as demo

    click.echo(f"demo buyer accepting leads at http://{host}:{port}/<name> (pings: /<name>/ping)")
    demo.serve(host, port)


def init_app(app: Flask) -> None:
    app.cli.add_command(demo_buyer)
    groups = (db_cli, caps_cli, settle_cli, buyers_cli, publishers_cli, leads_cli, events_cli, payments_cli)
    for group in (*groups, suppression_cli):
        app.cli.add_command(group)


HELP = """Floodgate's operator commands, on the service's ledger and Redis (DATABASE_URL,
REDIS_URL; from a checkout, scripts/run's own unless set). Every command has --help, and ends
with one "Error: ..." line on bad input or an unreachable database or Redis
(docs/operations.md "CLI")."""


def main() -> None:
    """`scripts/floodgate`: the app's commands (init_app) as `flask --app wsgi` runs them, from
    the repository, under Floodgate's name and help rather than Flask's generic ones."""
    group = FlaskGroup(name="floodgate", help=HELP)
    # The app is wsgi's: no --app to load another, no Flask version to show.
    group.params = [param for param in group.params if param.name not in ("app", "version")]
    group.main(prog_name="scripts/floodgate", obj=ScriptInfo(app_import_path="wsgi"))
