"""Which addresses an outbound call may reach: never this host in any spelling, nor link-local,
nor OUTBOUND_DENY_NETS; loopback only with OUTBOUND_ALLOW_LOOPBACK, and only as itself.
Why and the forms covered: docs/security.md "Outbound calls never reach this host"."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# cloud metadata, link-local and unspecified addresses (OUTBOUND_DENY_NETS' default)
DEFAULT_DENY_NETS = ("169.254.0.0/16", "fe80::/10", "0.0.0.0/8", "fd00:ec2::254/128")
# Refused whatever the configuration says: "this host" without being loopback (a connect to
# 0.0.0.0 or :: lands on this machine), and link-local (cloud metadata, the LAN segment).
ALWAYS_REFUSED = tuple(ipaddress.ip_network(n) for n in ("0.0.0.0/8", "::/128", "169.254.0.0/16", "fe80::/10"))
LOOPBACK = tuple(ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128"))
# IPv6 prefixes whose last 32 bits are an IPv4 address a packet ends up at: IPv4-mapped (a
# dual-stack socket connects to the IPv4 address itself), IPv4-translated (RFC 2765),
# IPv4-compatible (deprecated, RFC 4291) and the NAT64 well-known prefix (RFC 6052).
_EMBEDDING = tuple(ipaddress.ip_network(n) for n in ("::ffff:0:0/96", "::ffff:0:0:0/96", "::/96", "64:ff9b::/96"))
# NAT64's local-use prefix (RFC 8215): where the IPv4 address sits depends on the length the
# network chose, so no address in it is judged by one; refused as a whole.
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")
_V6_LOOPBACK = ipaddress.IPv6Address("::1")


def _embedded(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (and may be translated to on the way)."""
    found = []
    if ip != _V6_LOOPBACK and any(ip in n for n in _EMBEDDING):  # ::1 is loopback's own spelling
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)  # (server, client)
    return found


class DenyList:
    """The networks no outbound call may reach: OUTBOUND_DENY_NETS and what is always refused."""

    def __init__(self, nets: Iterable[str] = DEFAULT_DENY_NETS, *, allow_loopback: bool = False) -> None:
        self.nets = tuple(ipaddress.ip_network(n, strict=False) for n in nets)
        self.allow_loopback = allow_loopback

    def denies(self, address: str) -> bool:
        """Whether this IP address (a resolved one, maybe with an IPv6 zone) is refused."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return True  # not an address at all: never connect to it
        if isinstance(ip, ipaddress.IPv6Address):
            if ip in _LOCAL_NAT64:
                return True
            # An IPv4 address inside an IPv6 one is never loopback's own spelling: refused
            # even where loopback is allowed (::ffff:127.0.0.1 is 127.0.0.1 in disguise).
            if any(self._refused(v4, loopback_ok=False) for v4 in _embedded(ip)):
                return True
        return self._refused(ip, loopback_ok=self.allow_loopback)

    def _refused(self, ip: Address, *, loopback_ok: bool) -> bool:
        if any(ip in net for net in ALWAYS_REFUSED if net.version == ip.version):
            return True
        if not loopback_ok and any(ip in net for net in LOOPBACK if net.version == ip.version):
            return True
        return any(ip in net for net in self.nets if net.version == ip.version)

    def refusal(self, url: str) -> str | None:
        """Why `url` may not be called, checked when it is saved (None: it may): an http(s) URL
        with a host, no credentials in it, and a host that is no refused address. A numeric
        host in any form but the canonical one (`0`, `2130706433`, `0x7f.1`, `127.1`) is
        refused: resolvers read those as addresses, and a reader of the config would not."""
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            return "must be an http(s) URL with a valid host and port"
        host = parts.hostname
        if parts.scheme not in ("http", "https") or not host:
            return "must be an http(s) URL with a host"
        if parts.username is not None or parts.password is not None:
            return "must not carry credentials (user:pass@); put them in headers"
        if "%" in host:
            return "must not name a network interface (an IPv6 zone id)"
        try:
            ipaddress.ip_address(host)
        except ValueError:  # ip_address takes canonical dotted quads only: `127.1`, `010.0.0.1` land here
            if _numeric_host(host):
                return "names an address in a non-canonical form; write it as a dotted quad"
            if _loopback_name(host) and not self.allow_loopback:
                return "names this host (localhost), which outbound calls never reach"
            return None  # a name: checked again on every address it resolves to
        if self.denies(host):
            return "names an address of this host, link-local or in OUTBOUND_DENY_NETS"
        return None


def _numeric_host(host: str) -> bool:
    """A host that inet_aton would read as an IPv4 address (`0`, `2130706433`, `127.1`)."""
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def _loopback_name(host: str) -> bool:
    """`localhost` and the names under it, which resolve to loopback (RFC 6761, 6.3)."""
    name = host.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost")
