"""Gunicorn settings for `web`, from config.load() like every other setting. gevent patches
the standard library here, before the app (and with it ssl, socket, redis and pymysql) is
imported by any worker."""

from gevent import monkey

monkey.patch_all()

import sys

from webhooks import metrics
from webhooks.config import load as load_config  # `config` would be read as a gunicorn setting
from webhooks.errors import ConfigError
from webhooks.web import gunicorn_errors

try:
    cfg = load_config()
except ConfigError as exc:  # one clear line and exit status 1, not gunicorn's traceback
    sys.exit(f"floodgate: configuration error: {exc}")
metrics.init(cfg)  # in the master: the forked workers inherit the samples folder

gunicorn_errors.install()  # the requests gunicorn refuses itself get JSON errors too

bind = f"0.0.0.0:{cfg.port}"
worker_class = "gevent"
workers = cfg.web_concurrency
worker_connections = cfg.worker_connections
timeout = 30
# On SIGTERM (a deploy) a worker stops accepting and lets the leads in flight finish: longer
# than the longest routing of one lead, so no lead is cut between a buyer's yes and its answer.
graceful_timeout = cfg.graceful_timeout_s
keepalive = 5
accesslog = cfg.access_log or None
# The path without its query string: /ops?token=<ADMIN_TOKEN> must never reach a log file.
access_log_format = '%(h)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms "%(a)s"'
errorlog = "-"
loglevel = cfg.log_level
control_socket_disable = True  # unused; several instances on one host would share its path


def on_starting(server) -> None:
    """Master start: forget the samples of processes of a previous run."""
    metrics.remove_stale_files()


def child_exit(server, worker) -> None:
    """A worker died: its live gauges no longer count (its counters do)."""
    metrics.mark_process_dead(worker.pid)
