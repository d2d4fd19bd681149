"""WSGI entry point: `gunicorn -c gunicorn.conf.py wsgi:app` (gevent is patched in the config)."""

import gc

from webhooks import create_app

app = create_app()
# What starting made (modules, the app, its caches: ~77,000 objects) lives as long as the
# process: out of the collector's sight, a full collection walks only what requests made
# (one took ~21 ms with them, a pause every greenlet of the worker waits out).
gc.freeze()
