"""Tries of the admin token are counted per client address on every path that takes one (the
/ops login form, `/ops?token=`, the bearer header on /ops and on the admin API): wrong ones use
the address' tries up, on any path, and then that address gets 429 on all of them, the right
token included; another address is never locked out by it."""

from __future__ import annotations

import http.client
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from tests.conftest import ADMIN_TOKEN
from webhooks.web.logins import LOGIN_FAILURES, LOGIN_WINDOW_S

GUESS = "a-wrong-guess-of-the-admin-token"


def _form(client, token: str) -> int:
    return client.post("/ops/login", data={"token": token}).status_code


def _query(client, token: str) -> int:
    return client.get(f"/ops?token={token}").status_code


def _ops_bearer(client, token: str) -> int:
    return client.get("/ops", headers={"Authorization": f"Bearer {token}"}).status_code


def _admin_bearer(client, token: str) -> int:
    return client.get("/v1/admin/buyers/nobody", headers={"Authorization": f"Bearer {token}"}).status_code


# each path: how it answers a wrong token and the right one while the address has tries left
PATHS: dict[str, tuple[Callable[[object, str], int], int, int]] = {
    "login form": (_form, 401, 303),
    "?token=": (_query, 303, 303),  # a wrong one: sent to the login form; the right one: the session
    "bearer on /ops": (_ops_bearer, 401, 200),
    "bearer on the admin API": (_admin_bearer, 401, 404),
}


def client_from(app, address: str):
    """The app's test client, every request of it coming from `address`."""
    client = app.test_client(use_cookies=False)
    client.environ_base["REMOTE_ADDR"] = address
    return client


@pytest.mark.parametrize("path", PATHS)
def test_wrong_tokens_on_any_path_lock_that_address_out_of_every_path(app, api, path):
    attacker, operator = client_from(app, "203.0.113.7"), client_from(app, "198.51.100.2")
    send, wrong, _ = PATHS[path]
    for _ in range(LOGIN_FAILURES):
        assert send(attacker, GUESS) == wrong
    for other, (send_other, _wrong, right) in PATHS.items():
        assert send_other(attacker, ADMIN_TOKEN) == 429, other  # the right token too: no oracle
        assert send_other(operator, ADMIN_TOKEN) == right, other  # another address: untouched
    locked = attacker.get("/v1/admin/buyers/x", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert locked.json["error"]["code"] == "too_many_attempts"
    assert 0 < int(locked.headers["Retry-After"]) <= LOGIN_WINDOW_S
    form = attacker.post("/ops/login", data={"token": ADMIN_TOKEN})
    assert "Too many wrong tokens" in form.get_data(as_text=True) and "Set-Cookie" not in form.headers


def test_tries_on_different_paths_add_up(app, api):
    attacker = client_from(app, "203.0.113.8")
    sends = [send for send, _wrong, _right in PATHS.values()]
    for i in range(LOGIN_FAILURES):
        sends[i % len(sends)](attacker, GUESS)
    assert [send(attacker, ADMIN_TOKEN) for send in sends] == [429] * len(sends)


def test_the_right_token_uses_no_tries(app, api):
    operator = client_from(app, "198.51.100.3")
    for _ in range(3 * LOGIN_FAILURES):
        assert _admin_bearer(operator, ADMIN_TOKEN) == 404
        assert _form(operator, ADMIN_TOKEN) == 303
    for _ in range(LOGIN_FAILURES - 1):
        assert _admin_bearer(operator, GUESS) == 401
    assert _ops_bearer(operator, ADMIN_TOKEN) == 200
    assert _ops_bearer(operator, GUESS) == 401  # the last try
    assert _ops_bearer(operator, ADMIN_TOKEN) == 429


def test_a_request_without_a_token_uses_no_tries(app, api):
    visitor = client_from(app, "198.51.100.4")
    for _ in range(2 * LOGIN_FAILURES):
        assert visitor.get("/v1/admin/buyers/x").status_code == 401
        assert visitor.get("/ops").status_code == 303
        assert visitor.get("/ops?token=").status_code == 303
    assert _admin_bearer(visitor, ADMIN_TOKEN) == 404


def test_an_ipv6_host_is_counted_by_its_64_and_a_mapped_address_as_ipv4(app, api):
    for i in range(LOGIN_FAILURES):  # a host picks a new address of its /64 for each guess
        assert _admin_bearer(client_from(app, f"2001:db8:0:7::{i + 1:x}"), GUESS) == 401
    assert _admin_bearer(client_from(app, "2001:db8:0:7::ffff"), ADMIN_TOKEN) == 429
    assert _admin_bearer(client_from(app, "2001:db8:0:8::1"), ADMIN_TOKEN) == 404
    for _ in range(LOGIN_FAILURES):
        _admin_bearer(client_from(app, "::ffff:203.0.113.9"), GUESS)
    assert _admin_bearer(client_from(app, "203.0.113.9"), ADMIN_TOKEN) == 429


def _status(base: str, token: str, source: str) -> int:
    """One admin API call to the server at `base` with `token`, sent from the address `source`."""
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", "/v1/admin/buyers/nobody", headers={"Authorization": f"Bearer {token}"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_many_guesses_at_once_compare_no_more_than_the_limit(web):
    """Across gunicorn's workers, 200 wrong tokens at once from one address: exactly
    LOGIN_FAILURES are compared (401), the others refused (429); the operator on another
    address still gets in."""
    with ThreadPoolExecutor(max_workers=50) as pool:
        statuses = list(pool.map(lambda _: _status(web.url, GUESS, "127.0.0.1"), range(200)))
    assert statuses.count(401) == LOGIN_FAILURES and statuses.count(429) == 200 - LOGIN_FAILURES
    assert _status(web.url, ADMIN_TOKEN, "127.0.0.1") == 429
    assert _status(web.url, ADMIN_TOKEN, "127.0.0.2") == 404


# the way in and out; a set-up link is its own key (webhooks/web/people/setup.py)
OPEN_PATHS = ("/ops/login", "/ops/logout", "/ops/logged-out", "/ops/setup/<token>")


def test_every_admin_and_console_route_refuses_a_request_without_the_token(app, redis_server):
    """Whichever module or blueprint a route of /v1/admin or /ops is declared in, the token
    check runs before it: no route answers a request that carries none."""
    client, reached = app.test_client(), []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith(("/v1/admin", "/ops")) or rule.rule in OPEN_PATHS:
            continue
        path = re.sub(r"<[^>]+>", "x", re.sub(r"<int:[^>]+>", "1", rule.rule))  # what each converter takes
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            status = client.open(path, method=method).status_code
            if status not in (303, 401, 403):
                reached.append(f"{method} {path} ({rule.endpoint}): {status}")
    assert not reached, reached
