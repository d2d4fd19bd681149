"""The operator console as a test's browser uses it: log in through the form, read a page's
form token (CSRF), post a form with the headers a browser sends from the site's own page."""

from __future__ import annotations

import re
from http.cookies import SimpleCookie

import requests

COOKIE = "floodgate_ops"
_TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


def login(http: requests.Session, base: str, token: str, next_page: str = "/ops") -> str:
    """POST the login form; the session cookie's value (the session keeps it too)."""
    resp = http.post(f"{base}/ops/login", data={"token": token, "next": next_page}, allow_redirects=False, timeout=10)
    assert resp.status_code == 303, resp.text[:500]
    session_id = SimpleCookie(resp.headers["Set-Cookie"])[COOKIE].value
    http.cookies.set(COOKIE, session_id, path="/ops")  # the in-process adapter fills no cookie jar
    return session_id


def form_token(http: requests.Session, base: str, path: str = "/ops") -> str:
    """The session's CSRF token, as the page at `path` carries it in its forms."""
    resp = http.get(base + path, timeout=10)
    assert resp.status_code == 200, resp.text[:500]
    found = _TOKEN.search(resp.text)
    assert found, f"no form token on {path}"
    return found.group(1)


def post_form(
    http: requests.Session, base: str, path: str, fields: dict[str, str] | list[tuple[str, str]], csrf: str
) -> requests.Response:
    """Post a form of the console as the browser does from one of its pages: same origin."""
    data = [*(fields.items() if isinstance(fields, dict) else fields), ("csrf_token", csrf)]
    headers = {"Origin": base, "Sec-Fetch-Site": "same-origin"}
    return http.post(base + path, data=data, headers=headers, allow_redirects=False, timeout=10)
