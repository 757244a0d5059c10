"""The filtering proxy: what a sandbox with ``network="proxy"`` may reach.

The sandbox runs in a network namespace of its own with only its loopback.
A listening TCP socket made there is handed to the supervisor, which serves
it here; the program is told about it through ``HTTP_PROXY``/``HTTPS_PROXY``
/``ALL_PROXY``.  Every connection out is made by this process, from its own
network, after the rules said yes:

* one listener speaks HTTP ``CONNECT`` (a raw tunnel: TLS stays end to end),
  plain HTTP forward proxying (``GET http://host/...``: one request, one
  upstream connection) and SOCKS5 (no authentication, ``CONNECT`` only),
  told apart by the first byte;
* names are matched case-insensitively after IDNA encoding; ``*.example.com``
  matches names below example.com, not example.com itself; an entry with
  ``:port`` allows that port only; deny entries win over allow entries;
* the proxy resolves names (``resolver``), never the sandbox, checks every
  address it got, and connects to a checked address (no second lookup):
  loopback, private, link-local, CGNAT, multicast, reserved and unspecified
  addresses (and IPv4-mapped, NAT64 and 6to4 forms of those) are refused
  unless an allow entry names the address or a network holding it, so a
  name that resolves to 127.0.0.1 does not lead into the host;
* an IP literal as the target is refused unless an allow entry holds it;
* per sandbox: concurrent connections, total bytes both ways, an idle
  timeout, a connect timeout and a timeout for the request head.

Each refused attempt is a ``net_denied`` :class:`NetEvent` at once; each
allowed one a ``net_allowed`` when it ends, with bytes and how it ended.
Events, errors and logs carry host, port and byte counts only: never a URL,
path, query string or header.

One daemon thread runs an asyncio loop for every sandbox of a
:class:`ProxyServer`; :func:`shared` is the process-wide one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import errno
import ipaddress
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = [
    "HEAD_LIMIT",
    "NetEvent",
    "ProxyLimits",
    "ProxyServer",
    "Rules",
    "Served",
    "shared",
]

logger = logging.getLogger("sbxlimit.proxy")
logger.addHandler(logging.NullHandler())

# The longest request head (HTTP request line and headers) read; beyond it: 400.
HEAD_LIMIT = 16 * 1024
_CHUNK = 64 * 1024
# How long a closing connection may take to hand over what is still buffered,
# and to read what the client still sends after an error reply (so that the
# reply is not lost to a reset), before it is cut.
_LINGER = 2.0
_LINGER_BYTES = 256 * 1024

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# ---------------------------------------------------------------- rules

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_RFC1918 = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)


def _name(text: str) -> str:
    """The ASCII, lower-case form of a DNS name (IDNA for non-ASCII), a
    trailing dot dropped; ValueError if it is not a name."""
    if text.endswith("."):
        text = text[:-1]
    if not text:
        raise ValueError("empty name")
    if not text.isascii():
        try:
            text = text.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError("not a valid (IDNA) name") from None
    text = text.lower()
    if len(text) > 253 or not all(_LABEL.match(label) for label in text.split(".")):
        raise ValueError("not a valid name")
    # What inet_aton would read as an address (127.1, 0x7f000001, 2130706433)
    # is no name: refusing it keeps a resolver from turning it into one.
    if text.rsplit(".", 1)[-1].isdigit() or text.startswith("0x"):
        raise ValueError("a numeric form that is not a plain IP address")
    try:
        socket.inet_aton(text)
    except OSError:
        return text
    raise ValueError("a numeric form that is not a plain IP address")


def _host(text: str) -> IPAddress | str:
    """An IP literal (brackets allowed around IPv6) or a normalized name."""
    if text.startswith("[") and text.endswith("]"):
        ip = ipaddress.ip_address(text[1:-1])
        if ip.version != 6:
            raise ValueError("only IPv6 addresses go in brackets")
        return ip
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return _name(text)


def _special(ip: IPAddress) -> str | None:
    """Why an address is not a public one (None if it is)."""
    if isinstance(ip, ipaddress.IPv6Address):
        # Forms that carry an IPv4 address are judged by it.
        inner = ip.ipv4_mapped or ip.sixtofour
        if inner is None and ip in _NAT64:
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None:
            return _special(inner)
        if ip.is_site_local:
            return "site-local"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "shared address space (CGNAT)"
    if any(ip in n for n in _RFC1918):
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "special-purpose"
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    text: str
    port: int | None
    name: str | None = None  # exact name
    suffix: str | None = None  # "*.example.com" -> ".example.com"
    net: IPNetwork | None = None

    def matches_name(self, name: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.name is not None:
            return name == self.name
        return self.suffix is not None and name.endswith(self.suffix)

    def matches_ip(self, ips: tuple[IPAddress, ...], port: int) -> bool:
        if self.net is None or (self.port is not None and self.port != port):
            return False
        return any(ip.version == self.net.version and ip in self.net for ip in ips)


def _parse_entry(text: object) -> _Entry:
    if not isinstance(text, str):
        raise ValueError(f"network rule {text!r}: not a string")
    try:
        return _entry(text.strip())
    except ValueError as e:
        raise ValueError(f"network rule {text!r}: {e}") from None


def _entry(s: str) -> _Entry:
    port: int | None = None
    if s.startswith("["):
        inner, bracket, rest = s[1:].partition("]")
        if not bracket:
            raise ValueError("no closing ']'")
        if rest:
            if not rest.startswith(":"):
                raise ValueError("expected ':port' after ']'")
            port = _port(rest[1:])
        net = ipaddress.ip_network(inner)
        if net.version != 6:
            raise ValueError("only IPv6 addresses go in brackets")
        return _Entry(s, port, net=net)
    host = s
    if s.count(":") == 1:
        host, _, p = s.partition(":")
        port = _port(p)
    if "/" in host:
        try:
            return _Entry(s, port, net=ipaddress.ip_network(host))
        except ValueError as e:
            raise ValueError(f"not a network ({e})") from None
    try:
        return _Entry(s, port, net=ipaddress.ip_network(ipaddress.ip_address(host)))
    except ValueError:
        pass
    if host.startswith("*."):
        return _Entry(s, port, suffix="." + _name(host[2:]))
    if "*" in host:
        raise ValueError("'*' only as the first label: '*.example.com'")
    return _Entry(s, port, name=_name(host))


def _port(text: str) -> int:
    if not _PORT.match(text) or not 0 < int(text) < 65536:
        raise ValueError(f"bad port {text!r}")
    return int(text)


def _entries(what: str, entries: object) -> tuple[_Entry, ...]:
    if isinstance(entries, str | bytes):
        raise ValueError(f"{what} must be a list of rules, not one string: [{entries!r}]")
    if not isinstance(entries, Iterable):
        raise ValueError(f"{what} must be a list of rules")
    return tuple(_parse_entry(e) for e in entries)


@dataclasses.dataclass(frozen=True)
class Rules:
    """Where a sandbox may connect.  Entries: ``"pypi.org"``,
    ``"*.github.com"`` (below github.com only), ``"example.com:443"`` (that
    port only), ``"203.0.113.7"``, ``"10.1.0.0/16"``,
    ``"[2001:db8::1]:443"``.  Deny entries take the same forms and win."""

    allow: tuple[str, ...]
    deny: tuple[str, ...] = ()
    _allow: tuple[_Entry, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _deny: tuple[_Entry, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_allow", _entries("allow", self.allow))
        object.__setattr__(self, "_deny", _entries("deny", self.deny))
        object.__setattr__(self, "allow", tuple(self.allow))
        object.__setattr__(self, "deny", tuple(self.deny))

    @classmethod
    def parse(cls, allow: Iterable[str], deny: Iterable[str] = ()) -> Rules:
        """Validate the entries; ValueError names the first bad one."""
        for what, entries in (("allow", allow), ("deny", deny)):
            if isinstance(entries, str | bytes):
                raise ValueError(f"{what} must be a list of rules, not one string: [{entries!r}]")
        return cls(tuple(allow), tuple(deny))

    def check_name(self, host: str, port: int) -> str | None:
        """None if `host` (a name or an IP literal) may be reached on
        `port`, else why not.  For a name, its addresses are checked once
        resolved (check_address)."""
        try:
            target = _host(host)
        except ValueError as e:
            return f"invalid host name ({e})"
        return self._check_target(target, port)

    def _check_target(self, target: IPAddress | str, port: int) -> str | None:
        if not 0 < port < 65536:
            return f"invalid port {port}"
        if not isinstance(target, str):
            return self.check_address(str(target), port, named=False)
        for d in self._deny:
            if d.matches_name(target, port):
                return f"{target}:{port} is denied by {d.text!r}"
        if not any(a.matches_name(target, port) for a in self._allow):
            return f"{target}:{port} is not in the allow list"
        return None

    def check_address(self, ip: str, port: int, *, named: bool) -> str | None:
        """None if a connection to address `ip` on `port` is allowed, else
        why not.  named: the address was resolved from an allowed name (an
        IP literal asked for directly must itself be in the allow list)."""
        try:
            addr = ipaddress.ip_address(ip.removeprefix("[").removesuffix("]"))
        except ValueError:
            return f"invalid address {ip!r}"
        ips: tuple[IPAddress, ...] = (addr,)
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            ips = (addr, addr.ipv4_mapped)
        for d in self._deny:
            if d.matches_ip(ips, port):
                return f"{addr} port {port} is denied by {d.text!r}"
        listed = any(a.matches_ip(ips, port) for a in self._allow)
        if listed:
            return None
        if not named:
            return f"IP address {addr} port {port} is not in the allow list"
        why = _special(addr)
        if why is not None:
            return f"address {addr} is {why} (allow it by address to reach it)"
        return None


# ---------------------------------------------------------------- events, limits


@dataclasses.dataclass(frozen=True)
class ProxyLimits:
    """Limits on what one sandbox does through the proxy.

    connections: client connections open at once (past it: 503 / SOCKS
    0x01).  bytes: total bytes both ways to and from the upstreams; past it
    every connection is cut and new ones refused.  idle_timeout: seconds
    without a byte either way, then the connection is closed.
    connect_timeout: seconds to resolve and connect.  head_timeout: seconds
    for the client to send its request head (or SOCKS handshake).
    kept_events: how many events Served.events() keeps (on_event gets all).
    """

    connections: int | None = 64
    bytes: int | None = None
    idle_timeout: float = 300.0
    connect_timeout: float = 10.0
    head_timeout: float = 10.0
    kept_events: int = 10_000

    def __post_init__(self) -> None:
        for name in ("connections", "bytes"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"ProxyLimits.{name} must be a positive integer or None")
        for name in ("idle_timeout", "connect_timeout", "head_timeout"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"ProxyLimits.{name} must be a positive number of seconds")
        if not isinstance(self.kept_events, int) or self.kept_events < 0:
            raise ValueError("ProxyLimits.kept_events must be an integer >= 0")


@dataclasses.dataclass(frozen=True)
class NetEvent:
    """One connection attempt of a sandbox through the proxy.

    event: ``net_denied`` (refused, reported at once; ``ended`` is None) or
    ``net_allowed`` (reported when it ends).  protocol: ``connect`` (HTTP
    CONNECT), ``http`` (plain HTTP forward), ``socks5``, or ``unknown`` for
    a connection closed before its request was read (past the connection
    limit).  host: the name asked for (normalized) or the IP literal.
    address: the address connected to.  reason: why it was refused, or how
    an allowed one ended if not normally (``idle timeout``, ``byte limit``,
    ``proxy closed``, ``connect timeout``, ``connection refused``, ...).
    bytes_up / bytes_down: bytes sent to / received from the upstream.
    """

    event: str
    sandbox_id: str
    protocol: str
    host: str
    port: int
    address: str | None
    reason: str | None
    bytes_up: int
    bytes_down: int
    started: float
    ended: float | None


class _Refused(Exception):
    """Refused: a net_denied event.  limit: by a limit, not by the rules."""

    def __init__(self, reason: str, *, limit: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.limit = limit


class _Failed(Exception):
    """Allowed, but the upstream could not be reached."""

    def __init__(self, reason: str, socks: int, status: int, address: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.socks = socks
        self.status = status
        self.address = address


class _BadRequest(Exception):
    pass


@dataclasses.dataclass(slots=True)
class _Request:
    protocol: str
    host: str  # as asked (not yet normalized)
    port: int
    head: bytes | None = None  # plain HTTP: the head to send upstream
    command: int = 1  # SOCKS: 1 is CONNECT, the only one served


# ---------------------------------------------------------------- HTTP and SOCKS heads

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_DROP = frozenset((b"connection", b"keep-alive", b"host", b"proxy-connection"))


def _authority(text: bytes, default_port: int | None) -> tuple[str, int]:
    """host and port from ``host:port`` / ``[v6]:port`` (port optional with
    a default)."""
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        raise _BadRequest("host is not UTF-8") from None
    if s.startswith("["):
        host, bracket, rest = s.partition("]")
        host += bracket
        if not bracket or (rest and not rest.startswith(":")):
            raise _BadRequest("bad host")
        p = rest[1:] if rest else None
    elif ":" in s:
        host, _, p = s.rpartition(":")
    else:
        host, p = s, None
    if p is None:
        if default_port is None:
            raise _BadRequest("no port")
        port = default_port
    elif not _PORT.match(p) or not 0 < int(p) < 65536:
        raise _BadRequest("bad port")
    else:
        port = int(p)
    if not host:
        raise _BadRequest("no host")
    return host, port


def _parse_http(head: bytes) -> _Request:
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise _BadRequest("bad request line")
    method, target, version = parts
    if not _TOKEN.match(method) or version not in (b"HTTP/1.0", b"HTTP/1.1"):
        raise _BadRequest("bad request line")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):
            raise _BadRequest("bad header")
        value = value.strip(b" \t")
        if any(c in value for c in b"\r\n\0"):
            raise _BadRequest("bad header")
        headers.append((name, value))
    if method == b"CONNECT":
        host, port = _authority(target, None)
        return _Request("connect", host, port)
    if target[:7].lower() != b"http://":
        raise _BadRequest("only absolute http:// URLs (use CONNECT for https)")
    rest = target[7:]
    end = len(rest)
    for sep in b"/?#":
        i = rest.find(bytes((sep,)))
        if i >= 0:
            end = min(end, i)
    authority, path = rest[:end], rest[end:].partition(b"#")[0]
    if b"@" in authority:
        raise _BadRequest("user information in the URL")
    host, port = _authority(authority, 80)
    if not path.startswith(b"/"):
        path = b"/" + path
    out = [method + b" " + path + b" " + version, b"Host: " + authority]
    for name, value in headers:
        lower = name.lower()
        # Proxy-* is for us, and upstream gets one request per connection.
        if lower in _DROP or lower.startswith(b"proxy-"):
            continue
        out.append(name + b": " + value)
    out += [b"Connection: close", b"", b""]
    return _Request("http", host, port, b"\r\n".join(out))


def _printable(text: str) -> str:
    """A host as asked, safe to store when it is not a valid name."""
    return "".join(
        c if " " <= c < "\x7f" else c.encode("unicode_escape").decode("ascii") for c in text[:255]
    )


_HTTP_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def _http_reply(status: int, text: str) -> bytes:
    body = f"sbxlimit proxy: {text}\n".encode("ascii", "backslashreplace")
    return (
        f"HTTP/1.1 {status} {_HTTP_REASONS[status]}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii") + body


_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


def _socks_reply(code: int) -> bytes:
    # The bound address is not the caller's business: 0.0.0.0:0.
    return bytes((5, code, 0, 1, 0, 0, 0, 0, 0, 0))


def _default_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


# ---------------------------------------------------------------- serving


def _socks_greeting(buf: bytearray) -> int | None:
    """The length of a complete SOCKS5 greeting at the start of buf (None:
    not yet), -1 if it offers no method we take (we take "no
    authentication" only)."""
    if len(buf) < 2 or len(buf) < 2 + buf[1]:
        return None
    return 2 + buf[1] if 0 in buf[2 : 2 + buf[1]] else -1


def _socks_request(r: bytearray) -> tuple[int, _Request | int | None]:
    """Parse a SOCKS5 request: (its length, what it asks) where what it
    asks is a _Request, an int (refuse with this reply code) or None (wait
    for more)."""
    if r and r[0] != 5:
        raise _BadRequest("bad SOCKS version")
    if len(r) < 5:
        return 0, None
    _, cmd, _, atyp = r[:4]
    if atyp == 1:
        start, end = 4, 8
    elif atyp == 4:
        start, end = 4, 20
    elif atyp == 3:
        start, end = 5, 5 + r[4]
    else:
        return 0, 8
    if len(r) < end + 2:
        return 0, None
    raw = bytes(r[start:end])
    # A name is checked (and refused if it is not one) by the rules.
    host = raw.decode("utf-8", "backslashreplace") if atyp == 3 else str(ipaddress.ip_address(raw))
    port = int.from_bytes(r[end : end + 2], "big")
    # Other commands (BIND, UDP ASSOCIATE) are refused once the target is
    # known, so that the refusal is a net_denied event like any other.
    return end + 2, _Request("socks5", host, port, command=cmd)


class _Conn(asyncio.Protocol):
    """One client connection: its request head, then the relay to the
    upstream (whose side is _Upstream).  Data is copied in the transports'
    callbacks, with their flow control: a side that does not read pauses
    reading from the other, so nothing is buffered without bound."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.loop = served._loop
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.phase = "head"  # head, open (connecting), relay, linger (after an error reply)
        self.buf = bytearray()
        self.socks = False
        self.greeted = False
        self.http = False
        self.request: asyncio.Future[_Request | None] = self.loop.create_future()
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.client_lost = False
        self.upstream_lost = True  # until it is made
        self.client_eof = False
        self.upstream_eof = False
        self.reason: str | None = None
        self.up = 0
        self.down = 0
        self.last = 0.0
        self.lingered = 0
        self.early = bytearray()  # what the upstream sent before the relay began
        self.timer: asyncio.TimerHandle | None = None  # head deadline, then idle
        self.linger_timer: asyncio.TimerHandle | None = None

    # -- the client's transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.client = transport
        self.timer = self.loop.call_later(self.served.limits.head_timeout, self._head_timeout)

    def data_received(self, data: bytes) -> None:
        if self.phase == "relay":
            assert self.upstream is not None
            self.served._forward(self, self.upstream, data, True)
        elif self.phase == "head":
            self.buf += data
            try:
                self._parse()
            except Exception as e:
                msg = str(e) if isinstance(e, _BadRequest) else "malformed request"
                self.refuse(_socks_reply(1) if self.socks else _http_reply(400, msg))
        elif self.phase == "linger":
            self.lingered += len(data)
            if self.lingered > _LINGER_BYTES:
                self.abort()
        else:  # open: what came with the head waits for the upstream
            self.buf += data
            if len(self.buf) > _CHUNK and self.client is not None:
                self.client.pause_reading()

    def eof_received(self) -> bool:
        self.client_eof = True
        if self.phase == "relay":
            assert self.upstream is not None
            if not self.upstream.is_closing() and self.upstream.can_write_eof():
                self.upstream.write_eof()
            self._both_eof()
            return True
        return self.phase == "open"  # else: gone before asking, or done lingering

    def connection_lost(self, exc: Exception | None) -> None:
        self.client_lost = True
        if not self.request.done():
            self.request.set_result(None)
        if self.upstream is not None and not self.upstream_lost:
            self.upstream.abort()  # nobody is left to deliver to
        self._check_finished()

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

    # -- states

    def _parse(self) -> None:
        assert self.client is not None
        buf = self.buf
        if buf[0] == 5:
            self.socks = True
            greeting = _socks_greeting(buf)
            if greeting is None:
                return
            if greeting < 0:
                self.refuse(b"\x05\xff")
                return
            if not self.greeted:
                self.greeted = True
                self.client.write(b"\x05\x00")
            used, what = _socks_request(buf[greeting:])
            if isinstance(what, _Request):
                self._have(what, greeting + used)
            elif isinstance(what, int):
                self.refuse(_socks_reply(what))
            elif len(buf) > 1024:  # longer than any greeting and request
                raise _BadRequest("SOCKS request too long")
            return
        end = buf.find(b"\r\n\r\n", 0, HEAD_LIMIT + 4)
        if end < 0:
            if len(buf) > HEAD_LIMIT:
                raise _BadRequest(f"request head longer than {HEAD_LIMIT} bytes")
            return
        self._have(_parse_http(bytes(buf[: end + 4])), end + 4)

    def _have(self, req: _Request, used: int) -> None:
        assert self.client is not None
        del self.buf[:used]
        self.phase = "open"
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.request.set_result(req)

    def _head_timeout(self) -> None:
        self.timer = None
        if self.phase == "head":
            self.abort()

    def refuse(self, reply: bytes) -> None:
        """Send an error reply, end our side, and read (and drop) what the
        client still sends for a while, so that closing does not reset the
        reply away."""
        self.phase = "linger"
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.request.done():
            self.request.set_result(None)
        if self.client_lost or self.client is None:
            return
        try:
            self.client.write(reply)
            if self.client_eof:
                self.client.close()
            else:
                if self.client.can_write_eof():
                    self.client.write_eof()
                self.client.resume_reading()
        except (OSError, RuntimeError):
            # The client left while we answered (shutdown on a reset socket).
            self.abort()
            return
        self.linger_timer = self.loop.call_later(_LINGER, self.abort)

    def start_relay(self, req: _Request) -> None:
        assert self.client is not None and self.upstream is not None
        self.phase = "relay"
        self.http = req.head is not None
        self.last = self.loop.time()
        self.timer = self.loop.call_at(self.last + self.served.limits.idle_timeout, self._idle)
        if self.client_lost:
            self.upstream.abort()
            return
        if req.head is None:
            reply = (
                _socks_reply(0) if self.socks else b"HTTP/1.1 200 Connection established\r\n\r\n"
            )
            self.client.write(reply)
        pending = (req.head or b"") + bytes(self.buf)
        self.buf = bytearray()
        if pending and not self.served._forward(self, self.upstream, pending, True):
            return
        if self.early:
            early, self.early = bytes(self.early), bytearray()
            if not self.served._forward(self, self.client, early, False):
                return
            self.upstream.resume_reading()
        if self.client_eof:
            if self.upstream.can_write_eof():
                self.upstream.write_eof()
        else:
            self.client.resume_reading()

    def _both_eof(self) -> None:
        if self.client_eof and self.upstream_eof:
            self.close_gently()

    def close_gently(self) -> None:
        """Close both sides once what is buffered went, within _LINGER."""
        for t in (self.client, self.upstream):
            if t is not None:
                t.close()
        if self.linger_timer is None:
            self.linger_timer = self.loop.call_later(_LINGER, self.abort)

    def abort(self) -> None:
        for t in (self.client, self.upstream):
            if t is not None:
                t.abort()

    def cut(self, reason: str | None) -> None:
        if self.reason is None:
            self.reason = reason
        self.abort()

    def _idle(self) -> None:
        due = self.last + self.served.limits.idle_timeout
        if self.loop.time() >= due:
            self.timer = None
            self.cut("idle timeout")
        else:
            self.timer = self.loop.call_at(due, self._idle)

    def _check_finished(self) -> None:
        if self.client_lost and self.upstream_lost and not self.finished.done():
            for timer in (self.timer, self.linger_timer):
                if timer is not None:
                    timer.cancel()
            self.finished.set_result(None)


class _Upstream(asyncio.Protocol):
    """The upstream side of a relayed connection."""

    def __init__(self, conn: _Conn) -> None:
        self.conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.conn.upstream = transport
        self.conn.upstream_lost = False

    def data_received(self, data: bytes) -> None:
        c = self.conn
        if c.phase != "relay":
            # Before the client has had its reply (a server that speaks
            # first): kept for a moment, rather than pausing (which costs
            # two system calls on every connection).
            c.early += data
            if len(c.early) > _CHUNK and c.upstream is not None:
                c.upstream.pause_reading()
            return
        assert c.client is not None
        c.served._forward(c, c.client, data, False)

    def eof_received(self) -> bool:
        c = self.conn
        c.upstream_eof = True
        if c.http:
            c.close_gently()  # the response is over, so is the exchange
            return False
        assert c.client is not None
        if not c.client.is_closing() and c.client.can_write_eof():
            c.client.write_eof()
        c._both_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        c = self.conn
        c.upstream_lost = True
        if c.client is not None and not c.client_lost and c.phase == "relay":
            c.close_gently()
        c._check_finished()

    def pause_writing(self) -> None:
        if self.conn.client is not None:
            self.conn.client.pause_reading()

    def resume_writing(self) -> None:
        if self.conn.client is not None and self.conn.phase == "relay":
            self.conn.client.resume_reading()


class Served:
    """One sandbox's listener being served.  events() and close() may be
    called from any thread."""

    def __init__(
        self,
        server: ProxyServer,
        sandbox_id: str,
        listener: socket.socket,
        rules: Rules,
        limits: ProxyLimits,
        on_event: Callable[[NetEvent], None],
    ) -> None:
        self.sandbox_id = sandbox_id
        self.rules = rules
        self.limits = limits
        self._server = server
        self._loop = server._loop
        self._listener = listener
        self._on_event = on_event
        self._lock = threading.Lock()
        self._events: list[NetEvent] = []
        self.events_dropped = 0
        self._done = threading.Event()
        # Loop-thread state.
        self._tasks: set[asyncio.Task[None]] = set()
        self._conns: set[_Conn] = set()
        self._clients = 0
        self._bytes = 0
        self._closing: asyncio.Task[None] | None = None
        self._accepting = False

    # -- any thread

    def events(self) -> list[NetEvent]:
        """Every event so far, in order (the first limits.kept_events)."""
        with self._lock:
            return list(self._events)

    @property
    def bytes_used(self) -> int:
        """Bytes both ways so far, across this sandbox's connections."""
        return self._bytes

    @property
    def closed(self) -> bool:
        return self._done.is_set()

    def close(self) -> None:
        """Stop accepting, cut this sandbox's connections (``proxy closed``)
        and close the listener; returns when all of it is done (when called
        from the proxy's own thread, e.g. in on_event: once scheduled)."""
        if self._done.is_set():
            return
        if threading.get_ident() == self._server._thread.ident:
            self._aclose()
            return
        with self._server._lock:
            if not self._server._stopped:
                self._loop.call_soon_threadsafe(self._aclose)
        # Else the server's close() is closing every Served.
        self._done.wait()

    # -- loop thread

    def _start(self) -> None:
        self._listener.setblocking(False)
        self._loop.add_reader(self._listener.fileno(), self._accept)
        self._accepting = True

    def _aclose(self) -> asyncio.Task[None]:
        if self._closing is None:
            self._closing = self._loop.create_task(self._close())
        return self._closing

    async def _close(self) -> None:
        try:
            self._stop_accepting()
            self._listener.close()
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # Aborted transports close their sockets on the next iteration.
            await asyncio.sleep(0)
        finally:
            self._server._served.discard(self)
            self._done.set()

    def _stop_accepting(self) -> None:
        if self._accepting:
            self._accepting = False
            self._loop.remove_reader(self._listener.fileno())

    def _resume_accepting(self) -> None:
        if self._closing is None and not self._accepting:
            self._start()

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: wait rather than spin on a readable listener.
                    logger.warning("sbxlimit proxy: cannot accept (%s); pausing 1 s", e)
                    self._stop_accepting()
                    self._loop.call_later(1.0, self._resume_accepting)
                    return
                continue  # the client went before it was accepted
            cap = self.limits.connections
            if cap is not None and self._clients >= 2 * cap + 8:
                # Past the limit a request is still read, to answer it; this
                # far past it a connection is not worth a descriptor.
                sock.close()
                self._denied("unknown", "", 0, f"connection limit ({cap}) reached")
                continue
            self._clients += 1
            task = self._loop.create_task(self._run(sock))
            self._tasks.add(task)
            task.add_done_callback(self._run_done)

    def _run_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._clients -= 1
        if not task.cancelled() and task.exception() is not None:
            logger.error("sbxlimit proxy: a connection failed", exc_info=task.exception())

    def _emit(self, event: NetEvent) -> None:
        with self._lock:
            if len(self._events) < self.limits.kept_events:
                self._events.append(event)
            else:
                self.events_dropped += 1
        try:
            self._on_event(event)
        except Exception:
            logger.exception("sbxlimit proxy: on_event failed")

    def _denied(self, protocol: str, host: str, port: int, reason: str) -> None:
        self._emit(
            NetEvent(
                "net_denied", self.sandbox_id, protocol, host, port, None, reason,
                0, 0, time.time(), None,
            )
        )  # fmt: skip

    # -- one client connection

    async def _run(self, sock: socket.socket) -> None:
        conn = _Conn(self)
        try:
            await self._loop.connect_accepted_socket(lambda: conn, sock)
        except BaseException:
            sock.close()
            raise
        try:
            req = await conn.request
            if req is not None:
                await self._attempt(conn, req)
            await conn.finished
        except asyncio.CancelledError:
            conn.cut("proxy closed")
            await conn.finished  # aborted: both sides go within an iteration
            raise

    async def _attempt(self, conn: _Conn, req: _Request) -> None:
        started = time.time()
        target: IPAddress | str | None
        try:
            target = _host(req.host)
            display = str(target)
        except ValueError:
            target, display = None, _printable(req.host)
        address: str | None = None
        denied = False
        try:
            try:
                if req.command != 1:
                    raise _Refused(f"SOCKS command {req.command} not supported")
                address = await self._open(conn, req, target)
            except _Refused as e:
                # Said first: the reply below can fail on a client already gone.
                denied = True
                self._denied(req.protocol, display, req.port, e.reason)
                code = 7 if req.command != 1 else 1 if e.limit else 2
                status = 503 if e.limit else 403
                conn.refuse(_socks_reply(code) if conn.socks else _http_reply(status, e.reason))
                return
            except _Failed as e:
                conn.refuse(
                    _socks_reply(e.socks) if conn.socks else _http_reply(e.status, e.reason)
                )
                conn.reason, address = e.reason, e.address
            else:
                self._conns.add(conn)
                conn.start_relay(req)
            await conn.finished
        except asyncio.CancelledError:
            conn.cut("proxy closed")
            await conn.finished  # aborted: both sides go within an iteration
            raise
        finally:
            self._conns.discard(conn)
            if not denied:
                self._emit(
                    NetEvent(
                        "net_allowed", self.sandbox_id, req.protocol, display, req.port,
                        address, conn.reason, conn.up, conn.down, started, time.time(),
                    )
                )  # fmt: skip

    async def _open(self, conn: _Conn, req: _Request, target: IPAddress | str | None) -> str:
        """Check the limits and rules, resolve, connect; the address connected to."""
        cap = self.limits.bytes
        if cap is not None and self._bytes >= cap:
            raise _Refused(f"byte limit ({cap}) reached", limit=True)
        if self.limits.connections is not None and self._clients > self.limits.connections:
            raise _Refused(f"connection limit ({self.limits.connections}) reached", limit=True)
        port = req.port
        if target is None:
            why = self.rules.check_name(req.host, port)  # says why it is not a name
        else:
            why = self.rules._check_target(target, port)
        if why is not None or target is None:
            raise _Refused(why or "invalid host name")
        try:
            async with asyncio.timeout(self.limits.connect_timeout):
                if isinstance(target, str):
                    addresses = await self._resolve(target, port)
                else:
                    addresses = [str(target)]
                return await self._connect(conn, addresses, port)
        except TimeoutError:
            raise _Failed("connect timeout", 4, 504) from None

    async def _resolve(self, name: str, port: int) -> list[str]:
        resolver = self._server._resolver
        try:
            if isinstance(resolver, Mapping):
                found = list(resolver[name])
            else:
                found = await self._loop.run_in_executor(
                    self._server._executor, resolver, name, port
                )
        except Exception:
            raise _Failed("name not resolved", 4, 502) from None
        ok: list[str] = []
        first_refusal = None
        for text in found:
            try:
                ip = ipaddress.ip_address(text)
            except ValueError:
                continue
            why = self.rules.check_address(str(ip), port, named=True)
            if why is None:
                if str(ip) not in ok:
                    ok.append(str(ip))
            elif first_refusal is None:
                first_refusal = why
        if not ok:
            if first_refusal is not None:
                raise _Refused(f"{name}: {first_refusal}")
            raise _Failed("name not resolved", 4, 502)
        return ok

    async def _connect(self, conn: _Conn, addresses: list[str], port: int) -> str:
        """Connect to the first address that answers: the checked address
        itself, never a name (so no second lookup)."""
        last: OSError | None = None
        for address in addresses:
            ip = ipaddress.ip_address(address)
            sock = socket.socket(
                socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_STREAM
            )
            try:
                sock.setblocking(False)
                await self._loop.sock_connect(sock, (address, port))
                await self._loop.create_connection(lambda: _Upstream(conn), sock=sock)
            except OSError as e:
                sock.close()
                last = e
                continue
            except BaseException:
                sock.close()
                raise
            return address
        where = addresses[-1] if addresses else None
        if isinstance(last, ConnectionRefusedError):
            raise _Failed("connection refused", 5, 502, where)
        if last is not None and last.errno == errno.ENETUNREACH:
            raise _Failed("network unreachable", 3, 502, where)
        raise _Failed("host unreachable", 4, 502, where)

    def _forward(self, conn: _Conn, dst: asyncio.Transport, data: bytes, up: bool) -> bool:
        """Count and write `data`; False if the byte limit cut everything."""
        conn.last = self._loop.time()
        cap = self.limits.bytes
        over = cap is not None and len(data) > cap - self._bytes
        if cap is not None and over:
            data = data[: cap - self._bytes]
        n = len(data)
        self._bytes += n
        if up:
            conn.up += n
        else:
            conn.down += n
        if data and not dst.is_closing():
            dst.write(data)
        if over:
            for c in list(self._conns):
                c.cut("byte limit")
            conn.cut("byte limit")
            return False
        return True


class ProxyServer:
    """One daemon thread running an asyncio loop, serving the listeners of
    many sandboxes.

    resolver(host, port) -> IP address strings; by default
    ``socket.getaddrinfo`` (both families).  It runs on a small thread pool
    of the server's own, so a slow one does not stall other connections.
    A mapping {name: [addresses]} (tests, fixed tables) is looked up in
    place, with no thread; a name it lacks does not resolve.  Names are
    asked for in their normalized form (lower case, IDNA, no trailing dot).
    """

    def __init__(
        self,
        *,
        resolver: Callable[[str, int], list[str]] | Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._resolver = resolver or _default_resolver
        self._lock = threading.Lock()
        self._stopped = False
        self._served: set[Served] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=8, thread_name_prefix="sbxlimit-proxy-resolve"
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sbxlimit-proxy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def serve(
        self,
        sandbox_id: str,
        listener: socket.socket,
        rules: Rules,
        limits: ProxyLimits,
        on_event: Callable[[NetEvent], None],
    ) -> Served:
        """Serve a listening TCP socket for one sandbox.  The proxy owns the
        listener from now on: Served.close() closes it."""
        if not isinstance(listener, socket.socket) or listener.type != socket.SOCK_STREAM:
            raise TypeError("listener must be a listening TCP socket")
        if not listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ValueError("listener is not listening")
        if not isinstance(rules, Rules) or not isinstance(limits, ProxyLimits):
            raise TypeError("rules must be a Rules, limits a ProxyLimits")
        if threading.get_ident() == self._thread.ident:
            raise RuntimeError("serve() cannot be called from the proxy's thread")
        served = Served(self, sandbox_id, listener, rules, limits, on_event)
        with self._lock:
            if self._stopped:
                raise RuntimeError("this ProxyServer is closed")
            self._served.add(served)
            done = concurrent.futures.Future[None]()

            def start() -> None:
                try:
                    served._start()
                    done.set_result(None)
                except BaseException as e:
                    done.set_exception(e)

            self._loop.call_soon_threadsafe(start)
        try:
            done.result()
        except BaseException:
            self._served.discard(served)
            raise
        return served

    def close(self) -> None:
        """Close every Served, then stop the thread; idempotent."""
        if threading.get_ident() == self._thread.ident:
            raise RuntimeError("close() cannot be called from the proxy's thread")
        with self._lock:
            if self._stopped:
                return
            # From here serve() refuses, and Served.close() waits for this.
            self._stopped = True

        async def close_all() -> None:
            await asyncio.gather(*(s._aclose() for s in list(self._served)))

        asyncio.run_coroutine_threadsafe(close_all(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._executor.shutdown(wait=True, cancel_futures=True)

    @property
    def closed(self) -> bool:
        return self._stopped


_shared: ProxyServer | None = None
_shared_lock = threading.Lock()


def shared() -> ProxyServer:
    """The process-wide ProxyServer (default resolver), started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.closed:
            _shared = ProxyServer()
        return _shared


def _forget_after_fork() -> None:
    # The parent's server runs on a thread the child does not have: a
    # sandbox of the child's would wait for it for ever.  The child starts
    # its own at its first use.
    global _shared, _shared_lock
    _shared = None
    _shared_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
