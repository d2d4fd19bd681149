"""Operator commands: `flask --app wsgi <group> <command>`; each has --help."""
from __future__ import annotations

import click
from flask import Flask
from flask.cli import AppGroup

db_cli = AppGroup("db", help="Ledger schema.")


@db_cli.command("upgrade", help="Apply the numbered sql/ migrations not applied yet (idempotent).")
def upgrade_command() -> None:
    from .migrate import upgrade

    applied = upgrade(echo=click.echo)
    click.echo(f"applied {len(applied)} migration(s)" if applied else "nothing to apply")


def init_app(app: Flask) -> None:
    app.cli.add_command(db_cli)
