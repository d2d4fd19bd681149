"""Request bodies over 256 KiB are 413 too_large before parsing, with or without a
Content-Length: a chunked upload is neither cut to 256 KiB and routed nor a 400."""

from __future__ import annotations

import socket

from testkit.payments import counts
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Lead

LIMIT = 256 * 1024


def chunked(body: bytes, size: int = 16 * 1024):
    """A generator body: requests sends it with Transfer-Encoding: chunked, no Content-Length."""
    for i in range(0, len(body), size):
        yield body[i : i + size]


def padded_lead(lead_id: str, length: int) -> bytes:
    """A valid lead whose JSON text is exactly `length` bytes (padded inside a string)."""
    head, tail = b'{"lead_id": "' + lead_id.encode() + b'", "state": "TX", "pad": "', b'"}'
    return head + b"x" * (length - len(head) - len(tail)) + tail


def test_chunked_lead_over_256_kib_is_413_and_not_routed(api, buyer_server):
    buyer_server.add("acme")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    resp = api.http.post(f"{api.base}/v1/leads", data=chunked(padded_lead("big", LIMIT + 1)), headers=headers)
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["code"] == "too_large"
    assert not buyer_server.buyers["acme"].received
    ok = api.http.post(f"{api.base}/v1/leads", data=chunked(padded_lead("fits", LIMIT)), headers=headers)
    assert ok.status_code == 200 and ok.json()["status"] == "sold", ok.text


def test_chunked_admin_and_webhook_bodies_over_256_kib_are_413(api):
    big = b'{"name": "' + b"x" * LIMIT + b'"}'
    resp = api.http.put(
        f"{api.base}/v1/admin/publishers/surge",
        data=chunked(big),
        headers={**api.admin, "Content-Type": "application/json"},
    )
    assert (resp.status_code, resp.json()["error"]["code"]) == (413, "too_large")
    resp = api.http.post(
        f"{api.base}/v1/webhooks/paystack",
        data=chunked(big),
        headers={"Content-Type": "application/json", "x-paystack-signature": "00"},
    )
    assert (resp.status_code, resp.json()["error"]["code"]) == (413, "too_large")
    assert counts()["deliveries"] == 0


def _raw_http(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply) < reply.index(b"\r\n\r\n") + 4 + _length(reply):
            data = s.recv(65536)
            if not data:
                break
            reply += data
    return reply


def _length(reply: bytes) -> int:
    for line in reply.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_real_chunked_upload_to_gunicorn_over_256_kib_is_413_and_the_lead_is_not_kept(web_api, buyer_server):
    api = web_api
    buyer_server.add("acme")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()
    body = padded_lead("chunky", LIMIT + 4096)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunked(body, 8192)) + b"0\r\n\r\n"
    head = (
        f"POST /v1/leads HTTP/1.1\r\nHost: {api.base[7:]}\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    reply = _raw_http(api.base, head + chunks)
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.split()[1] == b"413", reply[:400]
    assert b'"too_large"' in rest
    assert not buyer_server.buyers["acme"].received
    with db.connection_context():
        assert Lead.select().where(Lead.lead_id == "chunky").count() == 0
    # requests' own chunked upload of a body that fits is routed as usual
    ok = api.http.post(
        f"{api.base}/v1/leads",
        data=chunked(padded_lead("small", 2048)),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert ok.status_code == 200 and ok.json()["status"] == "sold", ok.text
