"""WSGI entry point: `gunicorn -c gunicorn.conf.py wsgi:app` (gevent is patched in the config)."""

from webhooks import create_app

app = create_app()
