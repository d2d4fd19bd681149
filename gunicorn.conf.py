"""Gunicorn settings for `web`. gevent patches the standard library here, before the app (and
with it ssl, socket, redis and pymysql) is imported by any worker."""
from gevent import monkey

monkey.patch_all()

import os  # noqa: E402

bind = f"0.0.0.0:{os.environ.get('PORT', '8000')}"
worker_class = "gevent"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_connections = int(os.environ.get("WORKER_CONNECTIONS", "1000"))
timeout = 30
graceful_timeout = 10
keepalive = 5
accesslog = os.environ.get("ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "info")
control_socket_disable = True  # unused; several instances on one host would share its path

# Prometheus multiprocess mode: importing webhooks.metrics sets PROMETHEUS_MULTIPROC_DIR (if
# unset) before prometheus_client loads, and the forked workers inherit it.
from webhooks import metrics  # noqa: E402


def on_starting(server) -> None:
    """Master start: forget the samples of processes of a previous run."""
    metrics.remove_stale_files()


def child_exit(server, worker) -> None:
    """A worker died: its live gauges no longer count (its counters do)."""
    metrics.mark_process_dead(worker.pid)
