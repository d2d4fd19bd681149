"""The buyers of the soak (soak/run.py) and the receiver of payment events, in one process.

    python -m soak.buyers PORT LOG_PATH BUYER_TIMEOUT_MS

testkit/buyer_stub.py's server (a bare keep-alive HTTP/1.1 server on gevent, for low CPU per
lead), with these routes:
- `POST /<buyer>`: a buyer endpoint. `acme` and `steady` accept in 5-30 ms; `flaky` answers
  500 to 8% of new leads and rejects 4%; `slow` answers in 250-650 ms. A buyer that sees an
  `Idempotency-Key` again answers as it did the first time (API.md), and counts the lead once.
- `POST /_events`: the payment-events receiver (answers 200, records `webhook-id`).
- `GET /_hang/<buyer>/<seconds>`: that buyer stops answering for `seconds`: each post
  arriving meanwhile is held until the hang ends, then its connection closed unanswered.
- `GET /_stats`: per buyer, the time of its last accepted lead.

Every post is one JSON line in LOG_PATH: buyer, key, answer, arrival time (epoch s), how long
it was held (ms), and whether it was a repeat of a key already seen. An accept sent later
than BUYER_TIMEOUT_MS after arrival is marked `late` (Floodgate has timed it out by then).
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json
import os
import random
import signal
import sys
import time

import gevent
from gevent.server import StreamServer

from testkit.buyer_stub import read_request, reply

BUYERS = {
    # name: (delay range s, P(error 500), P(reject))
    "acme": ((0.005, 0.03), 0.0, 0.0),
    "flaky": ((0.005, 0.03), 0.08, 0.04),
    "slow": ((0.25, 0.65), 0.0, 0.0),
    "steady": ((0.005, 0.03), 0.0, 0.0),
}
ANSWERS = {
    "accept": (200, b'{"accepted": true}'),
    "reject": (200, b'{"accepted": false, "reason": "not today"}'),
    "error": (500, b'{"error": "boom"}'),
    "ok": (200, b'{"ok": true}'),
}


class State:
    def __init__(self, log_path: str, timeout_ms: int):
        self.log = open(log_path, "a", buffering=1 << 16)  # noqa: SIM115  (open for the process)
        self.timeout_s = timeout_ms / 1000
        self.decided: dict[str, str] = {}  # Idempotency-Key -> first answer
        self.seen: set[str] = set()
        self.hang_until: dict[str, float] = {}
        self.last_accept: dict[str, float] = {}
        self.rng = random.Random(11)

    def write(self, record: dict) -> None:
        self.log.write(json.dumps(record, separators=(",", ":")) + "\n")

    def flusher(self) -> None:
        while True:
            gevent.sleep(1)
            self.log.flush()


STATE: State


def buyer_post(sock, name: str, headers: dict) -> bool:
    """Answer one post to buyer `name`; False when the connection must be closed."""
    s = STATE
    arrived = time.time()
    key = headers.get("idempotency-key", "")
    repeat = key in s.seen
    s.seen.add(key)
    hung = s.hang_until.get(name, 0) > arrived
    if hung:  # hold, then drop: no answer at all
        gevent.sleep(s.hang_until[name] - arrived)
        answer = "hung"
    else:
        delays, p_error, p_reject = BUYERS[name]
        answer = s.decided.get(key)
        if answer is None:
            x = s.rng.random()
            answer = "error" if x < p_error else "reject" if x < p_error + p_reject else "accept"
            s.decided[key] = answer
        gevent.sleep(s.rng.uniform(*delays))
        try:
            reply(sock, *ANSWERS[answer])
        except OSError:
            answer += "-unsent"
    held = time.time() - arrived
    record = {"b": name, "k": key, "a": answer, "t": round(arrived, 3), "ms": round(held * 1000), "r": repeat}
    if answer == "accept":
        s.last_accept[name] = time.time()
        if held > s.timeout_s:
            record["late"] = True
    s.write(record)
    return not hung


def handle(sock, _addr) -> None:
    buf = b""
    try:
        while True:
            req = read_request(sock, buf)
            if req is None:
                return
            method, path, headers, body, buf = req
            parts = path.strip("/").split("/")
            if method == "POST" and parts[0] in BUYERS:
                if not buyer_post(sock, parts[0], headers):
                    return
            elif method == "POST" and parts[0] == "_events":
                try:
                    event = json.loads(body)
                    data = event.get("data", {})
                except ValueError:
                    event, data = {}, {}
                STATE.write(
                    {
                        "b": "_events",
                        "id": headers.get("webhook-id"),
                        "type": event.get("type"),
                        "provider": data.get("provider"),
                        "ref": data.get("reference"),
                        "amount": data.get("amount_minor"),
                        "t": round(time.time(), 3),
                    }
                )
                reply(sock, *ANSWERS["ok"])
            elif method == "GET" and parts[0] == "_hang" and len(parts) == 3:
                STATE.hang_until[parts[1]] = time.time() + float(parts[2])
                reply(sock, *ANSWERS["ok"])
            elif method == "GET" and parts[0] == "_stats":
                reply(sock, 200, json.dumps({"last_accept": STATE.last_accept}).encode())
            else:
                reply(sock, 404, b'{"error": "not found"}')
    except OSError:
        return
    finally:
        sock.close()


def main() -> None:
    global STATE
    port, log_path, timeout_ms = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    STATE = State(log_path, timeout_ms)
    gevent.spawn(STATE.flusher)
    gevent.signal_handler(signal.SIGTERM, lambda: (STATE.log.flush(), os._exit(0)))
    StreamServer(("127.0.0.1", port), handle, backlog=2048).serve_forever()


if __name__ == "__main__":
    main()
