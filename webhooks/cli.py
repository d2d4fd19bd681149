"""Operator commands: `flask --app wsgi <group> <command>`; each has --help."""
from __future__ import annotations

import json
import sys

import click
from flask import Flask, current_app
from flask.cli import AppGroup

db_cli = AppGroup("db", help="Ledger schema.")
caps_cli = AppGroup("caps", help="Cap counters in Redis.")
settle_cli = AppGroup("settlements", help="The queue of lead settlements.")


@db_cli.command("upgrade", help="Apply the numbered sql/ migrations not applied yet (idempotent).")
def upgrade_command() -> None:
    from .migrate import upgrade

    applied = upgrade(echo=click.echo)
    click.echo(f"applied {len(applied)} migration(s)" if applied else "nothing to apply")


@caps_cli.command("reconcile", help="Compare every active buyer's counters with the ledger now and "
                                    "correct drift (what the hourly job does).")
def reconcile_command() -> None:
    from .reconcile import reconcile_all

    ext = current_app.extensions
    drifts = reconcile_all(ext["redis"], ext["settle_redis"])
    for d in drifts:
        click.echo(f"{d['buyer_id']} {d['cap']} {d['window']}: counter {d['counter']} -> {d['expected']}")
    click.echo(f"{len(drifts)} drift(s) corrected")


@settle_cli.command("requeue", help="Requeue settlement jobs that ran out of retries (RQ's failed "
                                    "registry), e.g. after a long database outage.")
def requeue_command() -> None:
    from rq.registry import FailedJobRegistry

    q = current_app.extensions["queue"]
    registry = FailedJobRegistry(queue=q)
    ids = registry.get_job_ids()
    for job_id in ids:
        registry.requeue(job_id)
    click.echo(f"requeued {len(ids)} job(s) on {q.name}")


@settle_cli.command("status", help="Pending settlements and the state of the settlement queue.")
def status_command() -> None:
    from rq.registry import FailedJobRegistry, StartedJobRegistry

    from . import keys

    q = current_app.extensions["queue"]
    status = {
        "pending_settlements": current_app.extensions["settle_redis"].llen(keys.SETTLE_PENDING),
        "queued_jobs": q.count,
        "running_jobs": StartedJobRegistry(queue=q).count,
        "failed_jobs": FailedJobRegistry(queue=q).count,
    }
    json.dump(status, sys.stdout, indent=2)
    click.echo()


def init_app(app: Flask) -> None:
    for group in (db_cli, caps_cli, settle_cli):
        app.cli.add_command(group)
