"""The console's tests share a logged-in client of the in-process app and its form post."""

from __future__ import annotations

import pytest

from testkit.ops import form_token, login, post_form
from tests.conftest import ADMIN_TOKEN


@pytest.fixture
def browser(api):
    """The in-process app's client, logged in to the console: (session, csrf token)."""
    http = api.session()
    login(http, api.base, ADMIN_TOKEN)
    return http, form_token(http, api.base)


def post(api, browser, path, fields):
    """A form posted from a console page: its fields and the session's CSRF token."""
    http, csrf = browser
    return post_form(http, api.base, path, fields, csrf)
