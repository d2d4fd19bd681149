"""Every error is the JSON shape of docs/api.md, also when gunicorn refuses a request before the
app sees it (an over-long request line, too large or too many header fields, garbage)."""

from __future__ import annotations

import socket

import requests


def raw_request(url: str, data: bytes) -> tuple[bytes, bytes]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return head, body


def test_over_long_path_is_a_json_414(web):
    resp = requests.get(f"{web.url}/v1/admin/buyers/{'x' * 5000}", timeout=10)
    assert resp.status_code == 414 and resp.headers["Content-Type"] == "application/json"
    assert resp.json() == {"error": {"code": "uri_too_long", "message": "the request line is too long"}}


def test_over_long_query_with_a_token_is_json_and_does_not_echo_it(web):
    resp = requests.get(f"{web.url}/ops?token=secret-{'y' * 5000}", timeout=10)
    assert resp.status_code == 414 and resp.json()["error"]["code"] == "uri_too_long"
    assert "secret-" not in resp.text


def test_over_large_or_too_many_headers_are_a_json_431(web):
    for headers in ({"X-Big": "z" * 9000}, {f"X-H{i}": "1" for i in range(120)}):
        resp = requests.get(f"{web.url}/healthz", headers=headers, timeout=10)
        assert resp.status_code == 431, resp.text[:200]
        assert resp.json()["error"]["code"] == "headers_too_large"


def test_unparseable_request_is_a_json_400(web):
    head, body = raw_request(web.url, b"NOT A REQUEST\r\n\r\n")
    assert head.split(b"\r\n")[0].split(b" ")[1] == b"400" and b"Content-Type: application/json" in head
    assert body.startswith(b'{"error":{"code":"bad_request"')


def test_a_long_path_the_app_sees_is_a_json_404(api):
    resp = api.http.get(f"{api.base}/v1/admin/buyers/{'x' * 3000}", headers=api.admin)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
