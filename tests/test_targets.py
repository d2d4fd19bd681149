"""Outbound calls never reach this host (webhooks/targets.py): every spelling of it refused where
a URL is saved, and on the address actually connected to by each outbound path, with loopback
allowed as itself (as the tests' partners need) or not."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from testkit.servers import wait_until
from webhooks import config, outbound
from webhooks.errors import ConfigError, Unavailable
from webhooks.events import sender
from webhooks.leads.posting.delivery import Deliverer
from webhooks.leads.rules import consent
from webhooks.payments.providers import flutterwave
from webhooks.targets import DenyList

# This host, spelt so that no allowance of loopback lets it through.
THIS_HOST = [
    "http://[::]:80/",  # unspecified: a connect lands on ::1
    "http://0.0.0.0/",
    "http://0.1.2.3/",  # 0.0.0.0/8, "this network"
    "http://[::ffff:127.0.0.1]/",  # IPv4-mapped, three spellings of one address
    "http://[::ffff:7f00:1]/",
    "http://[0:0:0:0:0:ffff:127.0.0.1]/",
    "http://[::ffff:0.0.0.0]/",
    "http://[::ffff:0:7f00:1]/",  # IPv4-translated (RFC 2765)
    "http://[::127.0.0.1]/",  # IPv4-compatible (deprecated)
    "http://[64:ff9b::7f00:1]/",  # NAT64 well-known prefix
    "http://[64:ff9b:1::7f00:1]/",  # NAT64 local-use prefix, refused whole
    "http://[2002:7f00:1::1]/",  # 6to4 of 127.0.0.1
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",  # Teredo, client 127.0.0.1
    "http://[::1%25lo]/",  # a zone id names an interface of this host
    "http://[fe80::1%25eth0]/",
    "http://169.254.169.254/latest/meta-data",  # link-local: cloud metadata
    "http://[::ffff:169.254.169.254]/",
    "http://[fe80::1]/",
    "http://2130706433/",  # 127.0.0.1 as resolvers read it, not as a reader does
    "http://0x7f.1/",
    "http://0177.0.0.1/",
    "http://127.1/",
    "http://0/",
]
LOOPBACK = [
    "http://127.0.0.1:9100/acme",
    "http://127.8.9.10/",
    "http://[::1]:80/",
    "http://localhost/",
    "http://a.LOCALHOST./",
]


@pytest.mark.parametrize("allow_loopback", [False, True])
@pytest.mark.parametrize("url", THIS_HOST)
def test_every_spelling_of_this_host_is_refused_when_saved(url, allow_loopback):
    assert DenyList([], allow_loopback=allow_loopback).refusal(url)


@pytest.mark.parametrize("url", LOOPBACK)
def test_loopback_is_refused_unless_allowed_and_then_only_as_itself(url):
    assert DenyList().refusal(url)
    assert DenyList(allow_loopback=True).refusal(url) is None


@pytest.mark.parametrize("url", ["https://buyer.example/in?x=1", "http://8.8.8.8/", "http://[2606:4700::1111]/"])
def test_urls_of_other_hosts_are_accepted(url):
    assert DenyList().refusal(url) is None


def test_the_deny_list_still_refuses_what_it_names_even_as_loopback():
    assert DenyList(["127.0.0.0/8"], allow_loopback=True).refusal("http://127.0.0.1/")
    assert DenyList(["2606:4700::/32"]).refusal("http://[2606:4700::1111]/")


@contextmanager
def dual_stack_listener() -> Iterator[tuple[int, list[str]]]:
    """A socket on every address of this host, IPv4 and IPv6 (so that 127.0.0.1, ::1, :: and
    ::ffff:127.0.0.1 all reach it): yields its port and the peers that connected."""
    srv = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    srv.settimeout(0.1)
    peers: list[str] = []
    done = threading.Event()

    def accept() -> None:
        with srv:
            while not done.is_set():
                try:
                    conn, addr = srv.accept()
                except TimeoutError:
                    continue
                peers.append(addr[0])
                conn.close()  # no reply: each call fails, after connecting

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield srv.getsockname()[1], peers
    finally:
        done.set()


@contextmanager
def process_targets(*, allow_loopback: bool) -> Iterator[None]:
    """This process's outbound clients configured as a deployment's are, then as before."""
    before = outbound.deny_list()
    outbound.configure([], allow_loopback=allow_loopback)
    try:
        yield
    finally:
        outbound.configure([str(n) for n in before.nets], allow_loopback=before.allow_loopback)


def _buyer_post(url: str) -> None:
    Deliverer(2000).deliver(url, b"{}", "key-1")


def _ping(url: str) -> None:
    Deliverer(2000).ping(url, b"{}", 2.0)


def _event_delivery(url: str) -> None:
    sender.Sender(url, ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",), 2.0).send("msg_1", "{}")


def _flutterwave_verify(url: str) -> None:
    with pytest.raises(Unavailable):  # its Authorization: Bearer FLWSECK_... goes nowhere
        flutterwave.fetch_verification(url, "123", "FLWSECK_TEST-secret", 2.0)


def _trustedform_claim(url: str) -> None:
    tf = consent.TrustedForm(api_base=url, api_key="tf-key", timeout_ms=2000)
    tf.claim("https://cert.trustedform.com/" + "a" * 40, {"email": "a@b.example"}, "ref-1", 2.0)


PATHS: dict[str, Callable[[str], None]] = {
    "buyer post": _buyer_post,
    "ping": _ping,
    "event delivery": _event_delivery,
    "flutterwave verify": _flutterwave_verify,
    "trustedform claim": _trustedform_claim,
}
# Hosts that reach this host at connect time, and whether the test allows loopback as itself.
AT_CONNECT = [
    ("[::]", True),
    ("0.0.0.0", True),
    ("[::ffff:127.0.0.1]", True),
    ("[::ffff:7f00:1]", True),
    ("[0:0:0:0:0:ffff:127.0.0.1]", True),
    ("localhost", False),  # a name: judged on the address it resolves to
    ("2130706433", False),  # resolved by the resolver to 127.0.0.1
    ("0x7f.1", False),
    ("127.0.0.1", False),
    ("[::1]", False),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("host", "allow_loopback"), AT_CONNECT)
def test_no_outbound_path_connects_to_this_host(path, host, allow_loopback):
    call = PATHS[path]
    with dual_stack_listener() as (port, peers), process_targets(allow_loopback=allow_loopback):
        call(f"http://{host}:{port}")
        # connections are accepted in order: once this one is, any the call made would be too
        socket.create_connection(("127.0.0.1", port)).close()
        wait_until(lambda: len(peers) >= 1, timeout=5)
        assert len(peers) == 1
        # the same path, where loopback is allowed, reaches the listener by its own address
        outbound.configure([], allow_loopback=True)
        call(f"http://127.0.0.1:{port}")
        wait_until(lambda: len(peers) >= 2, timeout=5)


@pytest.mark.parametrize(
    "var", ["FLUTTERWAVE_API_BASE", "TRUSTEDFORM_API_BASE", "STRIPE_API_BASE", "PAYMENT_EVENTS_URL"]
)
@pytest.mark.parametrize("url", ["http://[::]:9", "http://[::ffff:127.0.0.1]:9", "http://0x7f.1:9"])
def test_a_provider_or_certificate_api_base_on_this_host_is_refused_at_start(var, url):
    env = {var: url, "OUTBOUND_ALLOW_LOOPBACK": "1", "PAYMENT_EVENTS_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
    with pytest.raises(ConfigError, match=var):
        config.load(env)
    loopback = {**env, var: "http://127.0.0.1:9"}
    assert config.load(loopback).outbound_allow_loopback
    with pytest.raises(ConfigError, match=var):
        config.load({**loopback, "OUTBOUND_ALLOW_LOOPBACK": "0"})


@pytest.mark.parametrize("url", ["http://[::]:9/x", "http://[::ffff:7f00:1]:9/x", "http://0.0.0.0:9/x"])
def test_a_buyer_ping_or_event_endpoint_on_this_host_is_refused_at_put(api, url):
    buyer = {"name": "Meta", "endpoint_url": url, "priority": 1, "price": "1.00"}
    resp = api.http.put(f"{api.base}/v1/admin/buyers/meta", json=buyer, headers=api.admin)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_buyer" and "endpoint_url" in resp.json()["error"]["message"]
    buyer = {**buyer, "endpoint_url": "http://127.0.0.1:9/x", "ping": {"url": url, "bid": "price"}}
    resp = api.http.put(f"{api.base}/v1/admin/buyers/meta", json=buyer, headers=api.admin)
    assert resp.status_code == 400 and "ping.url" in resp.json()["error"]["message"]
    resp = api.http.put(f"{api.base}/v1/admin/event-endpoints/meta", json={"url": url}, headers=api.admin)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_endpoint"
    assert api.http.get(f"{api.base}/v1/admin/buyers/meta", headers=api.admin).status_code == 404
