"""A buyer's circuits on the lead path (docs/api.md "One publisher cannot take a buyer from
another"): failed replies to one publisher's leads open the buyer's circuit for that publisher
only; connection errors, timeouts and failed replies to several publishers open it for all.
The in-process app on real Redis, with BREAKER_FAILURES=3 and BREAKER_COOLDOWN_MS=1500; the
buyers are real local HTTP servers."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from testkit.servers import wait_until
from webhooks import services
from webhooks.caps.breaker import breakers
from webhooks.storage.live import keys

POISON = {"comment": "poison"}  # what the picky buyer cannot digest


class PickyBuyer:
    """A buyer whose failures depend on the lead: a 500 to every lead carrying "poison", an
    accept to the rest. `hang` makes it answer nothing within the deadline."""

    def __init__(self):
        self.posts: list[dict] = []
        self.hang = False
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.posts.append(body)
                if outer.hang:
                    outer.release.wait(5)
                failed = "poison" in json.dumps(body["lead"])
                status, reply = (500, b'{"error": "boom"}') if failed else (200, b'{"accepted": true}')
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/picky"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def posts_of(self, publisher_id: str) -> int:
        return sum(1 for p in self.posts if p["publisher_id"] == publisher_id)

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def picky():
    buyer = PickyBuyer()
    yield buyer
    buyer.close()


def closed_port_url() -> str:
    """A URL on which nothing listens: every post is a refused connection."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/gone"


def network(api, buyer_server, picky_url: str, *publishers: str) -> dict[str, str]:
    """`picky` first, `backup` (always accepts) second; the API key of each publisher."""
    buyer_server.add("backup")
    api.put_buyer("picky", picky_url, priority=1)
    api.put_buyer("backup", buyer_server.url("backup"), priority=2)
    publisher_keys = {p: api.put_publisher(p) for p in publishers}
    api.settle_config()
    return publisher_keys


def first_attempt(api, key: str, lead_id: str, **fields) -> dict:
    body = api.post_lead(key, {"lead_id": lead_id, **fields}).json()
    assert body["status"] == "sold", body
    return body["attempts"][0]


def circuits(app) -> object:
    return breakers(services.of(app).store.redis, ["picky"])["picky"]


def test_failed_replies_to_one_publishers_leads_take_the_buyer_from_that_publisher_only(
    api, app, buyer_server, picky, worker
):
    key = network(api, buyer_server, picky.url, "rogue", "honest")
    for i in range(3):
        assert first_attempt(api, key["rogue"], f"bad{i}", **POISON)["outcome"] == "error"
    # the rogue's leads skip the buyer now, clean or not, without a call
    skipped = first_attempt(api, key["rogue"], "clean")
    assert skipped == {"buyer_id": "picky", "outcome": "circuit_open", "ms": 0, "circuit": "publisher"}
    assert picky.posts_of("rogue") == 3
    # ... while the other publisher's leads are still sold to it
    for i in range(5):
        assert first_attempt(api, key["honest"], f"fine{i}")["outcome"] == "accepted"
    assert picky.posts_of("honest") == 5

    record = api.wait_settled("clean", "rogue")
    assert {"buyer_id": "picky", "reason": "circuit_open", "circuit": "publisher"} in record["skipped"]
    # open, or half-open once its cool-down is over: not closed until a lead of its own succeeds
    breaker = api.get("/v1/admin/buyers/picky").json()["breaker"]
    assert breaker["state"] == "closed" and breaker["failures"] == 0
    assert breaker["publishers_open"] + breaker["publishers_half_open"] == ["rogue"]
    page = api.get("/ops").text
    assert 'data-publisher-breaker="rogue"' in page and 'data-publisher-breaker="honest"' not in page
    assert "picky: circuit_open (for this publisher)" in page


@pytest.mark.parametrize("failure", ["refused", "timeout"])
def test_connection_errors_and_timeouts_of_one_publisher_open_the_buyer_for_everyone(
    api, app, buyer_server, picky, failure
):
    url = closed_port_url() if failure == "refused" else picky.url
    picky.hang = failure == "timeout"
    key = network(api, buyer_server, url, "first", "other")
    expected = "error" if failure == "refused" else "timeout"
    for i in range(3):
        assert first_attempt(api, key["first"], f"lead{i}")["outcome"] == expected
    # not about the first publisher's leads: the buyer's own circuit is open, for every publisher
    skipped = first_attempt(api, key["other"], "other0")
    assert skipped == {"buyer_id": "picky", "outcome": "circuit_open", "ms": 0, "circuit": "buyer"}
    assert circuits(app).state == "open" and circuits(app).publishers == ()
    assert api.get("/v1/admin/buyers/picky").json()["breaker"]["state"] == "open"


def test_failed_replies_to_several_publishers_open_the_buyer_for_everyone(api, app, buyer_server, picky, reconfigure):
    # a cool-down of a minute: on a busy machine the first circuits half-opened (1.5 s) before the last
    reconfigure(breaker_cooldown_ms=60_000)
    key = network(api, buyer_server, picky.url, "p1", "p2", "p3", "p4")
    for publisher in ("p1", "p2"):
        for i in range(3):
            assert first_attempt(api, key[publisher], f"{publisher}-{i}", **POISON)["outcome"] == "error"
    # two publishers' circuits open: the others still reach the buyer
    assert first_attempt(api, key["p4"], "p4-early")["outcome"] == "accepted"
    for i in range(3):
        assert first_attempt(api, key["p3"], f"p3-{i}", **POISON)["outcome"] == "error"
    # three (BREAKER_PUBLISHERS) within a cool-down: the buyer's own circuit opens
    skipped = first_attempt(api, key["p4"], "p4-late")
    assert skipped == {"buyer_id": "picky", "outcome": "circuit_open", "ms": 0, "circuit": "buyer"}
    breaker = circuits(app)
    assert breaker.state == "open" and sorted(breaker.of("open")) == ["p1", "p2", "p3"]


def test_a_publishers_circuit_half_opens_to_one_probe_of_its_own_and_closes(api, app, buyer_server, picky):
    key = network(api, buyer_server, picky.url, "rogue", "honest")
    for i in range(3):
        first_attempt(api, key["rogue"], f"bad{i}", **POISON)
    wait_until(lambda: circuits(app).of("half_open") == ["rogue"], what="the rogue's circuit half-open")
    # another publisher's lead is no probe of the rogue's circuit
    assert first_attempt(api, key["honest"], "fine")["outcome"] == "accepted"
    assert circuits(app).of("half_open") == ["rogue"]
    # the rogue's next lead is its probe; failed, the circuit opens again
    assert first_attempt(api, key["rogue"], "probe1", **POISON)["outcome"] == "error"
    assert circuits(app).of("open") == ["rogue"]
    wait_until(lambda: circuits(app).of("half_open") == ["rogue"], what="half-open again")
    assert first_attempt(api, key["rogue"], "probe2")["outcome"] == "accepted"  # answered: closed
    assert circuits(app).publishers == ()
    redis = services.of(app).store.redis
    assert not redis.exists(keys.publisher_breaker("picky", "rogue"))
    assert first_attempt(api, key["rogue"], "after", **POISON)["outcome"] == "error"  # counting afresh


def test_the_buyers_own_circuit_half_opens_to_one_probe_and_closes(api, app, buyer_server, picky):
    key = network(api, buyer_server, picky.url, "first", "other")
    picky.hang = True
    for i in range(3):
        assert first_attempt(api, key["first"], f"slow{i}")["outcome"] == "timeout"
    assert first_attempt(api, key["other"], "skipped")["circuit"] == "buyer"
    picky.hang = False
    wait_until(lambda: circuits(app).state == "half_open", what="the buyer's circuit half-open")
    # a failed reply to one publisher's lead says nothing of the buyer: the circuit stays
    # half-open, and that publisher's own circuit counts it
    assert first_attempt(api, key["first"], "poison", **POISON)["outcome"] == "error"
    assert circuits(app).state == "half_open"
    assert first_attempt(api, key["other"], "probe")["outcome"] == "accepted"
    assert circuits(app).state == "closed"
    assert first_attempt(api, key["first"], "fine")["outcome"] == "accepted"
