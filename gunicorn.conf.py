"""Gunicorn settings for `web`, from config.load() like every other setting. gevent patches
the standard library here, before the app (and with it ssl, socket, redis and pymysql) is
imported by any worker."""

from gevent import monkey

monkey.patch_all()

import sys

from webhooks import metrics
from webhooks.config import load as load_config  # `config` would be read as a gunicorn setting
from webhooks.errors import ConfigError
from webhooks.web import gunicorn_errors, server

try:
    cfg = load_config()
except ConfigError as exc:  # one clear line and exit status 1, not gunicorn's traceback
    sys.exit(f"floodgate: configuration error: {exc}")
metrics.init(cfg)  # in the master: the forked workers inherit the samples folder

gunicorn_errors.install()  # the requests gunicorn refuses itself get JSON errors too

bind = cfg.bind  # HOST:PORT: 0.0.0.0 unless HOST says otherwise (docs/configuration.md)
# gevent's worker, reading each request's headers and body within REQUEST_READ_TIMEOUT_MS.
worker_class = server.DeadlineWorker.with_limits(
    read_timeout_ms=cfg.request_read_timeout_ms, max_body_bytes=cfg.max_body_bytes
)
workers = cfg.web_concurrency
# Every connection is a descriptor: the soft open-files limit goes up to the hard one, and what
# a worker also keeps open (Redis and database pools, buyer sockets, logs) is set aside.
_open_files = server.raise_open_files_limit()
_spare_files = cfg.redis_max_connections + cfg.db_pool_size + 256
worker_connections = min(cfg.worker_connections, _open_files - _spare_files)
if worker_connections < cfg.worker_connections:
    sys.stderr.write(
        f"floodgate: WORKER_CONNECTIONS {cfg.worker_connections} lowered to {worker_connections}: "
        f"the open-files limit is {_open_files} (raise its hard limit, ulimit -Hn)\n"
    )
timeout = 30
# On SIGTERM (a deploy) a worker stops accepting and lets the leads in flight finish: longer
# than the longest routing of one lead, so no lead is cut between a buyer's yes and its answer.
graceful_timeout = cfg.graceful_timeout_s
keepalive = 5
accesslog = cfg.access_log or None
# The path without its query string: /ops?token=<ADMIN_TOKEN> must never reach a log file.
access_log_format = '%(h)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms "%(a)s"'
logger_class = server.AccessLog  # nor the token of a user's set-up link, /ops/setup/<token>
errorlog = "-"
loglevel = cfg.log_level
control_socket_disable = True  # unused; several instances on one host would share its path


def on_starting(server) -> None:
    """Master start: forget the samples of processes of a previous run."""
    metrics.remove_stale_files()


def child_exit(server, worker) -> None:
    """A worker died: its live gauges no longer count (its counters do)."""
    metrics.mark_process_dead(worker.pid)
