"""The filtering proxy (sbxlimit._proxy) against real sockets: a listener
made here stands in for the sandbox's, real servers on the host stand in
for the internet, and a resolver table maps test names to their addresses.
Nothing here asserts a duration: waits are bounded, never measured."""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import logging
import os
import secrets
import shutil
import socket
import socketserver
import ssl
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from sbxlimit import _proxy
from sbxlimit._proxy import NetEvent, ProxyLimits, ProxyServer, Rules, Served

WAIT = 10.0  # the longest any wait here may take before the test fails
LOOP = "127.0.0.1"
TABLE = {
    name: [LOOP]
    for name in (
        "good.test",
        "other.test",
        "a.wild.test",
        "b.a.wild.test",
        "wild.test",
        "rebind.test",
        "tls.test",
        "web.test",
        "secret.corp.test",
        "open.corp.test",
    )
}
TABLE["mapped.test"] = ["::ffff:127.0.0.1"]
TABLE["mixed.test"] = ["10.1.2.3", LOOP]
TABLE["lan.test"] = ["192.168.1.10", "169.254.169.254"]


# ---------------------------------------------------------------- servers on the host


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    block_on_close = True  # server_close() joins the handler threads


@contextlib.contextmanager
def tcp_server(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A threaded TCP server on 127.0.0.1 running `handle(conn)`; its port."""

    live: set[socket.socket] = set()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            live.add(self.request)
            try:
                handle(self.request)
            except OSError:
                pass
            finally:
                live.discard(self.request)

    server = _Server((LOOP, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        # A test that failed half way may have left a connection open: end
        # it, so that joining the handler threads cannot hang.
        for conn in list(live):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()
        thread.join()


def _echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


@pytest.fixture
def echo() -> Iterator[int]:
    with tcp_server(_echo) as port:
        yield port


@pytest.fixture
def proxy() -> Iterator[ProxyServer]:
    server = ProxyServer(resolver=TABLE)
    yield server
    server.close()


class Sandbox:
    """A listener standing in for a sandbox's, served by the proxy."""

    def __init__(
        self,
        server: ProxyServer,
        allow: list[str],
        deny: tuple[str, ...] = (),
        limits: ProxyLimits | None = None,
        on_event: Callable[[NetEvent], None] | None = None,
    ) -> None:
        self.listener = socket.create_server((LOOP, 0))
        self.address = self.listener.getsockname()
        self.got: list[NetEvent] = []
        self.served: Served = server.serve(
            "sbx-test",
            self.listener,
            Rules.parse(allow, deny),
            limits or ProxyLimits(),
            on_event or self.got.append,
        )

    def connect(self) -> socket.socket:
        s = socket.create_connection(self.address, timeout=WAIT)
        return s

    def tunnel(self, target: str) -> tuple[socket.socket, int, bytes]:
        """HTTP CONNECT: the socket, the status and (if refused) the body."""
        s = self.connect()
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = read_head(s)
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            return s, status, read_all(s)
        return s, status, b""

    def socks(self, atyp: int, host: bytes, port: int, cmd: int = 1) -> tuple[socket.socket, int]:
        """SOCKS5: the socket and the reply code."""
        s = self.connect()
        s.sendall(b"\x05\x01\x00")
        assert recv_exactly(s, 2) == b"\x05\x00"
        if atyp == 3:
            host = bytes((len(host),)) + host
        s.sendall(bytes((5, cmd, 0, atyp)) + host + port.to_bytes(2, "big"))
        reply = recv_exactly(s, 10)
        assert reply[0] == 5
        return s, reply[1]

    def events(self, n: int) -> list[NetEvent]:
        """The events once there are at least n of them."""
        return wait_for(lambda: len(self.served.events()) >= n, self.served.events)


def wait_for(ready: Callable[[], bool], result: Callable[[], object]) -> list[NetEvent]:
    deadline = time.monotonic() + WAIT
    while not ready():
        assert time.monotonic() < deadline, f"waited {WAIT} s; have {result()!r}"
        time.sleep(0.01)
    got = result()
    assert isinstance(got, list)
    return got


def recv_exactly(s: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        assert chunk, f"closed after {got!r}"
        got += chunk
    return got


def read_head(s: socket.socket) -> bytes:
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(1)
        assert chunk, f"closed after {got!r}"
        got += chunk
    return got


def read_all(s: socket.socket) -> bytes:
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def closed_by_peer(s: socket.socket) -> bool:
    """True once the other end closed (EOF or reset), reading what is left."""
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


# ---------------------------------------------------------------- rules


def test_rules_parse_validates_and_names_the_bad_entry():
    r = Rules.parse(
        [
            "pypi.org",
            "*.github.com",
            "example.com:443",
            "203.0.113.7",
            "10.1.0.0/16",
            "[2001:db8::1]:443",
            "2001:db8::/32",
            "10.2.0.0/16:22",
            "Bücher.test.",
        ],
        ["evil.github.com"],
    )
    assert r.allow[0] == "pypi.org" and r.deny == ("evil.github.com",)
    for bad in ["", "*", "*.", "foo.*.com", "ex ample.com", "example.com:0", "example.com:99999"]:
        with pytest.raises(ValueError, match=r"network rule .*" + bad.replace("*", r"\*")):
            Rules.parse([bad])
    for bad in ["10.0.0.1/8", "[::1", "[127.0.0.1]:80", "a..b", "-x-.test", "x:y", "127.1"]:
        with pytest.raises(ValueError) as e:
            Rules.parse(["ok.test"], [bad])
        assert repr(bad) in str(e.value)
    with pytest.raises(ValueError, match="not one string"):
        Rules.parse("pypi.org")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="12"):
        Rules.parse([12])  # type: ignore[list-item]


def test_names_case_trailing_dot_idna_wildcards_and_ports():
    r = Rules.parse(["pypi.org", "*.github.com", "example.com:443", "xn--bcher-kva.test"])
    for host, port in [
        ("pypi.org", 443),
        ("PyPI.ORG.", 80),
        ("api.github.com", 443),
        ("a.b.GitHub.com", 22),
        ("example.com", 443),
        ("bücher.test", 443),
        ("BÜCHER.test.", 443),
    ]:
        assert r.check_name(host, port) is None, (host, port)
    for host, port in [
        ("github.com", 443),  # *.github.com is below github.com only
        ("evilgithub.com", 443),
        ("github.com.evil.org", 443),
        ("example.com", 80),  # port-qualified
        ("www.example.com", 443),
        ("pypi.org.evil", 443),
        ("pypi.org", 0),
    ]:
        assert r.check_name(host, port) is not None, (host, port)
    # Not names at all, or numeric forms a resolver would read as addresses.
    not_names = ["a..b", "x\x00.pypi.org", "x" * 64 + ".test", "127.1", "0x7f000001"]
    not_names += ["2130706433", "1.2.3.4.5", "pypi.org.123"]
    for host in not_names:
        why = r.check_name(host, 443)
        assert why is not None and "invalid host name" in why, host
    assert r.check_name("\udcff.test", 443) is not None  # does not encode


def test_addresses_in_special_ranges_are_refused_unless_listed():
    r = Rules.parse(["name.test", "10.1.0.0/16", "[2001:db8::1]:443", "198.51.100.7"])
    special = [
        "127.0.0.1", "127.8.9.10", "::1", "10.0.0.1", "172.16.5.4", "192.168.1.1",
        "169.254.169.254", "fe80::1", "fc00::1", "fd12::3", "100.64.0.1", "0.0.0.0", "::",
        "224.0.0.1", "ff02::1", "240.0.0.1", "255.255.255.255", "::ffff:127.0.0.1",
        "::ffff:10.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::", "fec0::1",
    ]  # fmt: skip
    for ip in special:
        assert r.check_address(ip, 443, named=True) is not None, ip
    for ip in ["93.184.216.34", "2606:4700::1111", "::ffff:93.184.216.34"]:
        assert r.check_address(ip, 443, named=True) is None, ip
        # Asked for as an IP literal, an address must itself be listed.
        assert r.check_address(ip, 443, named=False) is not None, ip
        assert r.check_name(ip, 443) is not None, ip
    # Listed: by network, by address (also in its IPv4-mapped form), by port.
    assert r.check_address("10.1.2.3", 80, named=False) is None
    assert r.check_address("10.1.2.3", 80, named=True) is None
    assert r.check_name("10.1.255.255", 80) is None
    assert r.check_address("10.2.0.1", 80, named=True) is not None
    assert r.check_address("::ffff:198.51.100.7", 80, named=False) is None
    assert r.check_name("2001:db8::1", 443) is None
    assert r.check_name("[2001:db8::1]", 443) is None
    assert r.check_name("2001:db8::1", 80) is not None
    assert "loopback" in (r.check_address("127.0.0.1", 1, named=True) or "")
    assert "CGNAT" in (r.check_address("100.64.0.1", 1, named=True) or "")


def test_deny_wins_over_allow():
    r = Rules.parse(
        ["*.corp.test", "good.test", "10.0.0.0/8", "127.0.0.1"],
        ["secret.corp.test", "good.test:22", "10.9.0.0/16", "127.0.0.1:25"],
    )
    assert r.check_name("open.corp.test", 443) is None
    assert "denied by 'secret.corp.test'" in (r.check_name("SECRET.corp.test.", 443) or "")
    assert r.check_name("good.test", 443) is None
    assert r.check_name("good.test", 22) is not None
    assert r.check_address("10.1.0.1", 443, named=True) is None
    assert r.check_address("10.9.0.1", 443, named=True) is not None
    assert r.check_address("10.9.0.1", 443, named=False) is not None
    assert r.check_address("127.0.0.1", 25, named=True) is not None
    assert r.check_address("::ffff:127.0.0.1", 25, named=True) is not None


def test_limits_are_validated():
    for bad in [{"connections": 0}, {"bytes": -1}, {"idle_timeout": 0}, {"connect_timeout": -1.0}]:
        with pytest.raises(ValueError):
            ProxyLimits(**bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- end to end


def test_connect_tunnel_works_and_counts_bytes(proxy, echo):
    sb = Sandbox(proxy, ["good.test", LOOP])
    s, status, _ = sb.tunnel(f"good.test:{echo}")
    assert status == 200
    payload = secrets.token_bytes(100_000)
    s.sendall(payload)
    assert recv_exactly(s, len(payload)) == payload
    s.close()
    (e,) = sb.events(1)
    assert (e.event, e.protocol, e.host, e.port, e.address) == (
        "net_allowed", "connect", "good.test", echo, LOOP,
    )  # fmt: skip
    assert (e.bytes_up, e.bytes_down, e.reason, e.sandbox_id) == (
        100_000,
        100_000,
        None,
        "sbx-test",
    )
    assert e.ended is not None and e.ended >= e.started
    assert sb.got == sb.served.events()
    assert sb.served.bytes_used == 200_000


def test_other_names_are_refused_with_403_and_an_event(proxy, echo):
    sb = Sandbox(proxy, ["good.test", LOOP])
    s, status, body = sb.tunnel(f"other.test:{echo}")
    assert status == 403
    assert body.count(b"\n") == 1 and b"other.test" in body and b"not in the allow list" in body
    s.close()
    (e,) = sb.events(1)
    assert (e.event, e.protocol, e.host, e.port, e.address) == (
        "net_denied", "connect", "other.test", echo, None,
    )  # fmt: skip
    assert "not in the allow list" in (e.reason or "") and e.ended is None


def test_wildcards_match_below_the_name_only(proxy, echo):
    sb = Sandbox(proxy, ["*.wild.test", LOOP])
    for name, want in [("a.wild.test", 200), ("b.a.wild.test", 200), ("wild.test", 403)]:
        s, status, _ = sb.tunnel(f"{name}:{echo}")
        assert status == want, name
        s.close()
    events = sb.events(3)
    assert {(e.host, e.event) for e in events} == {
        ("a.wild.test", "net_allowed"),
        ("b.a.wild.test", "net_allowed"),
        ("wild.test", "net_denied"),
    }


def test_port_qualified_entries_allow_that_port_only(proxy, echo):
    with tcp_server(_echo) as second:
        sb = Sandbox(proxy, [f"good.test:{echo}", f"{LOOP}:{echo}", f"{LOOP}:{second}"])
        s, status, _ = sb.tunnel(f"good.test:{echo}")
        assert status == 200
        s.close()
        s, status, _ = sb.tunnel(f"good.test:{second}")
        assert status == 403
        s.close()
        denied = [e for e in sb.events(2) if e.event == "net_denied"]
        assert [(e.host, e.port) for e in denied] == [("good.test", second)]


def test_ip_literals_are_refused_unless_listed(proxy, echo):
    sb = Sandbox(proxy, ["good.test"])
    for target in [f"{LOOP}:{echo}", f"[::1]:{echo}", "198.51.100.7:443", "8.8.8.8:53"]:
        s, status, _body = sb.tunnel(target)
        assert status == 403, target
        s.close()
    assert all(e.event == "net_denied" for e in sb.events(4))
    s, rep = sb.socks(1, socket.inet_aton(LOOP), echo)
    assert rep == 0x02
    s.close()
    s, rep = sb.socks(4, socket.inet_pton(socket.AF_INET6, "::1"), echo)
    assert rep == 0x02
    s.close()

    listed = Sandbox(proxy, [f"{LOOP}:{echo}"])
    s, status, _ = listed.tunnel(f"{LOOP}:{echo}")
    assert status == 200
    s.sendall(b"ping")
    assert recv_exactly(s, 4) == b"ping"
    s.close()
    s, rep = listed.socks(1, socket.inet_aton(LOOP), echo)
    assert rep == 0
    s.close()
    assert [(e.event, e.host) for e in listed.events(2)] == [("net_allowed", LOOP)] * 2


def test_a_name_resolving_into_the_host_is_refused_unless_its_address_is_allowed(proxy, echo):
    sb = Sandbox(proxy, ["rebind.test", "mapped.test", "lan.test"])
    for name in ["rebind.test", "mapped.test", "lan.test"]:
        s, status, _body = sb.tunnel(f"{name}:{echo}")
        assert status == 403, name
        s.close()
    s, rep = sb.socks(3, b"rebind.test", echo)
    assert rep == 0x02
    s.close()
    events = sb.events(4)
    assert [e.event for e in events] == ["net_denied"] * 4
    assert "127.0.0.1 is loopback" in (events[0].reason or "")
    assert all(e.address is None for e in events)

    allowed = Sandbox(proxy, ["rebind.test", "mapped.test", "mixed.test", LOOP])
    for name in ["rebind.test", "mapped.test", "mixed.test"]:
        s, status, _ = allowed.tunnel(f"{name}:{echo}")
        assert status == 200, name
        s.sendall(b"x")
        assert recv_exactly(s, 1) == b"x"
        s.close()
    # mixed.test resolves to 10.1.2.3 first: refused, so 127.0.0.1 is what
    # was connected to; mapped.test is connected to as checked.
    got = {e.host: ipaddress.ip_address(e.address or "") for e in allowed.events(3)}
    assert got == {
        "rebind.test": ipaddress.ip_address(LOOP),
        "mapped.test": ipaddress.ip_address("::ffff:127.0.0.1"),
        "mixed.test": ipaddress.ip_address(LOOP),
    }


def test_deny_beats_allow_end_to_end(proxy, echo):
    sb = Sandbox(proxy, ["*.corp.test", "good.test", "127.0.0.0/8"], deny=("secret.corp.test",))
    s, status, _ = sb.tunnel(f"open.corp.test:{echo}")
    assert status == 200
    s.close()
    s, status, body = sb.tunnel(f"secret.corp.test:{echo}")
    assert status == 403 and b"denied by" in body
    s.close()
    by_address = Sandbox(proxy, ["good.test", "127.0.0.0/8"], deny=("127.0.0.1",))
    s, status, body = by_address.tunnel(f"good.test:{echo}")
    assert status == 403 and b"denied by '127.0.0.1'" in body
    s.close()


def test_a_server_that_speaks_first_is_heard_after_the_reply(proxy):
    def banner(conn: socket.socket) -> None:
        conn.sendall(b"220 ready\r\n")
        _echo(conn)

    with tcp_server(banner) as port:
        sb = Sandbox(proxy, ["good.test", LOOP])
        s, status, _ = sb.tunnel(f"good.test:{port}")
        assert status == 200
        assert recv_exactly(s, 11) == b"220 ready\r\n"
        s.close()
        s, rep = sb.socks(3, b"good.test", port)
        assert rep == 0 and recv_exactly(s, 11) == b"220 ready\r\n"
        s.close()
        assert [e.bytes_down for e in sb.events(2)] == [11, 11]


def test_plain_http_is_forwarded_in_origin_form_without_proxy_headers(proxy):
    received: list[bytes] = []
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"

    def web(conn: socket.socket) -> None:
        received.append(read_head(conn))
        conn.sendall(response)

    with tcp_server(web) as port:
        sb = Sandbox(proxy, ["web.test", LOOP])
        s = sb.connect()
        s.sendall(
            f"GET http://Web.Test:{port}/p/secret-path?token=secret-query HTTP/1.1\r\n"
            f"Host: elsewhere.test\r\nProxy-Authorization: Basic c2VjcmV0\r\n"
            "Proxy-Connection: keep-alive\r\nConnection: keep-alive\r\n"
            "X-Secret-Header: secret-value\r\n\r\n".encode()
        )
        assert read_all(s) == response
        s.close()
        (e,) = sb.events(1)
        (up,) = received
        lines = up.decode().split("\r\n")
        assert lines[0] == "GET /p/secret-path?token=secret-query HTTP/1.1"
        assert f"Host: Web.Test:{port}" in lines and "Connection: close" in lines
        assert "X-Secret-Header: secret-value" in lines
        assert not [line for line in lines if line.lower().startswith(("proxy-", "host: else"))]
        assert [line.lower().startswith("connection") for line in lines].count(True) == 1
        assert (e.event, e.protocol, e.host, e.port) == ("net_allowed", "http", "web.test", port)
        assert (e.bytes_up, e.bytes_down) == (len(up), len(response))
        assert "secret" not in repr(sb.served.events())

        # A real client: urllib through the proxy.
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"http": f"http://{LOOP}:{sb.address[1]}"})
        )
        with opener.open(f"http://web.test:{port}/", timeout=WAIT) as r:
            assert r.read() == b"hello"
        assert received[-1].startswith(b"GET / HTTP/1.1\r\n")
        s, status, _ = sb.tunnel(f"other.test:{port}")
        assert status == 403
        s.close()
        s = sb.connect()
        s.sendall(f"GET http://other.test:{port}/x HTTP/1.1\r\n\r\n".encode())
        assert read_all(s).startswith(b"HTTP/1.1 403 ")
        s.close()
        assert len(received) == 2  # neither refused request reached the server


def test_socks5_works_end_to_end_and_refuses_what_it_must(proxy, echo):
    sb = Sandbox(proxy, ["good.test", LOOP])
    s, rep = sb.socks(3, b"good.test", echo)
    assert rep == 0
    s.sendall(b"a" * 3000)
    assert recv_exactly(s, 3000) == b"a" * 3000
    s.close()
    (e,) = sb.events(1)
    assert (e.event, e.protocol, e.host, e.port, e.address) == (
        "net_allowed", "socks5", "good.test", echo, LOOP,
    )  # fmt: skip
    assert (e.bytes_up, e.bytes_down) == (3000, 3000)

    s, rep = sb.socks(3, b"other.test", echo)
    assert rep == 0x02
    s.close()
    for cmd in (2, 3):  # BIND, UDP ASSOCIATE
        s, rep = sb.socks(3, b"good.test", echo, cmd=cmd)
        assert rep == 0x07
        s.close()
    s, rep = sb.socks(3, b"bad\x00name", echo)
    assert rep == 0x02
    s.close()
    events = sb.events(5)[1:]
    assert [(e.event, e.host) for e in events[:3]] == [
        ("net_denied", "other.test"), ("net_denied", "good.test"), ("net_denied", "good.test"),
    ]  # fmt: skip
    assert "not supported" in (events[1].reason or "")
    assert events[3].host == "bad\\x00name" and "invalid host name" in (events[3].reason or "")

    s = sb.connect()  # an unknown address type
    s.sendall(b"\x05\x01\x00\x05\x01\x00\x09abcd\x00\x50")
    assert recv_exactly(s, 2) == b"\x05\x00" and recv_exactly(s, 2) == b"\x05\x08"
    s.close()
    s = sb.connect()  # no acceptable authentication method
    s.sendall(b"\x05\x01\x02")
    assert read_all(s) == b"\x05\xff"
    s.close()


def test_upstream_failures_answer_502_and_say_how_they_ended(proxy):
    free = socket.create_server((LOOP, 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    sb = Sandbox(proxy, ["good.test", "unknown.test", LOOP])
    s, status, body = sb.tunnel(f"good.test:{port}")
    assert status == 502 and b"connection refused" in body
    s.close()
    s, status, body = sb.tunnel(f"unknown.test:{port}")  # not in the resolver's table
    assert status == 502 and b"not resolved" in body
    s.close()
    s, rep = sb.socks(3, b"good.test", port)
    assert rep == 0x05
    s.close()
    s, rep = sb.socks(3, b"unknown.test", port)
    assert rep == 0x04
    s.close()
    events = sb.events(4)
    assert [(e.event, e.reason) for e in events] == [
        ("net_allowed", "connection refused"),
        ("net_allowed", "name not resolved"),
        ("net_allowed", "connection refused"),
        ("net_allowed", "name not resolved"),
    ]
    assert events[0].address == LOOP and events[1].address is None


def test_connection_limit(proxy, echo):
    sb = Sandbox(proxy, ["good.test", LOOP], limits=ProxyLimits(connections=2))
    held = [sb.tunnel(f"good.test:{echo}") for _ in range(2)]
    assert [status for _, status, _ in held] == [200, 200]
    s, status, body = sb.tunnel(f"good.test:{echo}")
    assert status == 503 and b"connection limit (2)" in body
    s.close()
    s, rep = sb.socks(3, b"good.test", echo)
    assert rep == 0x01
    s.close()
    denied = [e for e in sb.events(2) if e.event == "net_denied"]
    assert [e.reason for e in denied] == ["connection limit (2) reached"] * 2
    assert denied[0].host == "good.test"
    held[0][0].close()  # a slot frees once the proxy has seen it go
    wait_for(lambda: any(e.event == "net_allowed" for e in sb.served.events()), list)
    s, status, _ = sb.tunnel(f"good.test:{echo}")
    assert status == 200
    s.close()
    held[1][0].close()


def test_byte_limit_cuts_a_running_tunnel_and_refuses_new_ones(proxy, echo):
    sb = Sandbox(proxy, ["good.test", LOOP], limits=ProxyLimits(bytes=10_000))
    s, status, _ = sb.tunnel(f"good.test:{echo}")
    assert status == 200
    s.sendall(b"x" * 4000)
    assert recv_exactly(s, 4000) == b"x" * 4000
    s.sendall(b"y" * 4000)  # 8000 + 4000 both ways would pass 10000
    rest = read_all(s)
    assert len(rest) < 4000
    s.close()
    (e,) = sb.events(1)
    assert e.reason == "byte limit" and e.bytes_up + e.bytes_down <= 10_000
    assert sb.served.bytes_used <= 10_000
    s, status, body = sb.tunnel(f"good.test:{echo}")
    assert status == 503 and b"byte limit" in body
    s.close()
    s, rep = sb.socks(3, b"good.test", echo)
    assert rep == 0x01
    s.close()
    assert [e.reason for e in sb.events(3)[1:]] == ["byte limit (10000) reached"] * 2


def test_idle_timeout_closes_a_quiet_connection(proxy, echo):
    sb = Sandbox(proxy, ["good.test", LOOP], limits=ProxyLimits(idle_timeout=0.2))
    s, status, _ = sb.tunnel(f"good.test:{echo}")
    assert status == 200
    s.sendall(b"x")
    assert recv_exactly(s, 1) == b"x"
    assert closed_by_peer(s)  # nobody sends: the proxy ends it
    s.close()
    (e,) = sb.events(1)
    assert e.reason == "idle timeout" and (e.bytes_up, e.bytes_down) == (1, 1)


@pytest.mark.parametrize(
    "head",
    [
        b"HELLO\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: good.test\r\n\r\n",  # not a proxy request
        b"GET https://good.test/ HTTP/1.1\r\n\r\n",
        b"GET http://user:pw@good.test/ HTTP/1.1\r\n\r\n",
        b"CONNECT good.test HTTP/1.1\r\n\r\n",  # no port
        b"CONNECT good.test:70000 HTTP/1.1\r\n\r\n",
        b"CONNECT good.test:80 HTTP/2.0\r\n\r\n",
        b"CONNECT good.test:80 HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET http://good.test/ HTTP/1.1\r\nX: a\nInjected: b\r\n\r\n",
        b"GET http://good.test/ HTTP/1.1\r\n folded: x\r\n\r\n",
        b"\xff\xfe\r\n\r\n",
        b"CONNECT \xc3\x28:80 HTTP/1.1\r\n\r\n",
        b"A" * (20 * 1024),  # no end of head within the limit
        b"GET http://good.test/ HTTP/1.1\r\n" + b"X-Pad: " + b"p" * (17 * 1024) + b"\r\n\r\n",
        b"\x05\x01\x00\x04\x01\x00\x01",  # SOCKS version 4 inside a SOCKS5 greeting
    ],
)
def test_malformed_or_oversized_heads_get_400_and_the_next_client_is_served(
    proxy, echo, head, caplog
):
    caplog.set_level(logging.WARNING)
    sb = Sandbox(proxy, ["good.test", LOOP])
    s = sb.connect()
    s.sendall(head)
    answer = read_all(s)
    s.close()
    if head[0] == 5:
        assert answer == b"\x05\x00" + _proxy._socks_reply(1)
    else:
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
    s, status, _ = sb.tunnel(f"good.test:{echo}")
    assert status == 200
    s.close()
    assert [e.event for e in sb.events(1)] == ["net_allowed"]
    assert not [r for r in caplog.records if r.name.startswith(("sbxlimit", "asyncio"))]


def test_a_slow_head_is_cut_and_others_are_served_meanwhile(proxy, echo):
    sb = Sandbox(proxy, ["good.test", LOOP], limits=ProxyLimits(head_timeout=0.3))
    slow = sb.connect()
    slow.sendall(b"CONNECT good.te")
    s, status, _ = sb.tunnel(f"good.test:{echo}")
    assert status == 200
    s.close()
    assert closed_by_peer(slow)
    slow.close()
    socks_slow = sb.connect()
    socks_slow.sendall(b"\x05\x01")
    assert closed_by_peer(socks_slow)
    socks_slow.close()
    assert [e.event for e in sb.events(1)] == ["net_allowed"]


def test_a_client_that_does_not_read_is_not_buffered_for(proxy):
    sent = [0]
    stop = threading.Event()

    def flood(conn: socket.socket) -> None:
        chunk = b"z" * 65536
        conn.settimeout(0.2)
        while not stop.is_set() and sent[0] < 256 * 2**20:
            try:
                sent[0] += conn.send(chunk)
            except TimeoutError:
                continue

    with tcp_server(flood) as port:
        sb = Sandbox(proxy, ["good.test", LOOP])
        s, status, _ = sb.tunnel(f"good.test:{port}")
        assert status == 200
        # Wait until the flood stalls (the buffers on the way are full).
        last, still_since = -1, time.monotonic()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and time.monotonic() - still_since < 0.5:
            if sent[0] != last:
                last, still_since = sent[0], time.monotonic()
            time.sleep(0.05)
        stop.set()
        # The kernel's socket buffers on both sides of the proxy hold a few
        # MiB; a proxy reading without bound would have taken all 256 MiB.
        assert sent[0] < 64 * 2**20
        s.close()
        sb.events(1)


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


NO_OPENSSL = shutil.which("openssl") is None


def make_test_ca(d: str, name: str = "tls.test") -> None:
    """A certificate authority made here (ca.pem) and a server certificate
    it signed for `name` (srv.pem, srv.key), in directory `d`."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca = ["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=sbxlimit test CA"]
    ca += ["-addext", "basicConstraints=critical,CA:TRUE"]
    ca += ["-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    _openssl("req", "-x509", *ec, *ca, cwd=d)
    _openssl("req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", f"/CN={name}", cwd=d)
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write(
            f"subjectAltName=DNS:{name}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        )
    sign = ["-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial"]
    sign += ["-out", "srv.pem", "-days", "2", "-extfile", "ext.cnf"]
    _openssl("x509", "-req", *sign, cwd=d)


@pytest.mark.skipif(NO_OPENSSL, reason="needs the openssl command line")
def test_https_through_connect_with_a_test_ca_and_no_plaintext_at_the_proxy(proxy, tmp_path):
    d = str(tmp_path)
    make_test_ca(d)
    secret = secrets.token_hex(16).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = secret if self.path == "/" + secret.decode() else b"no"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(f"{d}/srv.pem", f"{d}/srv.key")
    https = http.server.ThreadingHTTPServer((LOOP, 0), Handler)
    https.block_on_close = True
    https.socket = server_ctx.wrap_socket(https.socket, server_side=True)
    https_thread = threading.Thread(target=https.serve_forever, args=(0.05,), daemon=True)
    https_thread.start()

    # A tap between the proxy and the server records what the proxy sent
    # and received upstream: it must be ciphertext only.
    tapped = {"up": b"", "down": b""}

    def tap(conn: socket.socket) -> None:
        upstream = socket.create_connection(https.server_address[:2])

        def copy(src: socket.socket, dst: socket.socket, key: str) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    tapped[key] += data
                    dst.sendall(data)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

        down = threading.Thread(target=copy, args=(upstream, conn, "down"))
        down.start()
        copy(conn, upstream, "up")
        down.join()
        upstream.close()

    try:
        with tcp_server(tap) as tap_port:
            sb = Sandbox(proxy, [f"tls.test:{tap_port}", f"{LOOP}:{tap_port}"])
            s, status, _ = sb.tunnel(f"tls.test:{tap_port}")
            assert status == 200
            client_ctx = ssl.create_default_context(cafile=f"{d}/ca.pem")
            with client_ctx.wrap_socket(s, server_hostname="tls.test") as tls:
                tls.sendall(b"GET /" + secret + b" HTTP/1.1\r\nHost: tls.test\r\n\r\n")
                head = read_head(tls)
                assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200")
                assert recv_exactly(tls, len(secret)) == secret
            (e,) = sb.events(1)
    finally:
        https.shutdown()
        https.server_close()
        https_thread.join()
    assert tapped["up"] and tapped["down"]
    assert secret not in tapped["up"] and secret not in tapped["down"]
    assert b"tls.test" in tapped["up"]  # the SNI, in the clear as TLS has it
    assert (e.bytes_up, e.bytes_down) == (len(tapped["up"]), len(tapped["down"]))


def _fds() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(f"{fd}:{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass
    return out


def _proxy_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sbxlimit-proxy")]


def test_close_leaves_no_descriptor_thread_or_connection(echo):
    assert not _proxy_threads()
    before = _fds()
    # A function resolver: the thread pool gets used too.
    server = ProxyServer(resolver=lambda host, _port: TABLE[host])
    one = Sandbox(server, ["good.test", LOOP])
    two = Sandbox(server, ["good.test", LOOP])
    live, status, _ = one.tunnel(f"good.test:{echo}")
    assert status == 200
    live.sendall(b"x")
    assert recv_exactly(live, 1) == b"x"
    half = one.connect()
    half.sendall(b"CONNECT good")
    socks_half = one.connect()
    socks_half.sendall(b"\x05\x01\x00")
    assert recv_exactly(socks_half, 2) == b"\x05\x00"
    other, status, _ = two.tunnel(f"good.test:{echo}")
    assert status == 200
    assert any(t.startswith("sbxlimit-proxy-resolve") for t in _proxy_threads())

    one.served.close()
    assert one.listener.fileno() == -1
    with pytest.raises(OSError):
        socket.create_connection(one.address, timeout=WAIT)
    for s in (live, half, socks_half):
        assert closed_by_peer(s)
        s.close()
    assert [(e.event, e.reason) for e in one.served.events()] == [("net_allowed", "proxy closed")]
    one.served.close()  # idempotent

    server.close()  # closes `two` as well
    assert two.served.closed and two.listener.fileno() == -1
    assert closed_by_peer(other)
    other.close()
    assert [(e.event, e.reason) for e in two.served.events()] == [("net_allowed", "proxy closed")]
    server.close()
    assert not _proxy_threads()
    with pytest.raises(RuntimeError):
        server.serve("late", socket.create_server((LOOP, 0)), Rules.parse([]), ProxyLimits(), print)
    # The echo server's side of the cut connections goes on its own threads.
    wait_for(lambda: _fds() <= before, lambda: sorted(_fds() - before))
    assert _fds() - before == set()


def test_on_event_that_raises_does_not_stop_the_proxy(proxy, echo, caplog):
    def bad(_e: NetEvent) -> None:
        raise RuntimeError("subscriber bug")

    sb = Sandbox(proxy, ["good.test", LOOP], on_event=bad)
    for _ in range(2):
        s, status, _ = sb.tunnel(f"other.test:{echo}")
        assert status == 403
        s.close()
    s, status, _ = sb.tunnel(f"good.test:{echo}")
    assert status == 200
    s.close()
    assert [e.event for e in sb.events(3)] == ["net_denied", "net_denied", "net_allowed"]
    assert any("on_event failed" in r.getMessage() for r in caplog.records)


def test_serve_checks_its_arguments_and_shared_is_one_server():
    server = ProxyServer(resolver=TABLE)
    try:
        unlistened = socket.socket()
        with pytest.raises(ValueError, match="not listening"):
            server.serve("x", unlistened, Rules.parse([]), ProxyLimits(), print)
        unlistened.close()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with pytest.raises(TypeError):
            server.serve("x", udp, Rules.parse([]), ProxyLimits(), print)
        udp.close()
    finally:
        server.close()
    first = _proxy.shared()
    try:
        assert _proxy.shared() is first
    finally:
        first.close()
    second = _proxy.shared()
    assert second is not first
    second.close()


def test_a_refused_client_that_resets_at_once_is_one_net_denied(proxy):
    # The refusal's reply meets a client already gone: still one event, a
    # denied one (a failed reply must not turn it into an allowed one).
    for _ in range(20):
        sb = Sandbox(proxy, ["good.test"])
        s = sb.connect()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.sendall(b"CONNECT other.test:443 HTTP/1.1\r\n\r\n")
        s.close()  # a reset, maybe before the reply is written
        (e,) = sb.events(1)
        sb.served.close()
        assert [x.event for x in sb.served.events()] == ["net_denied"], sb.served.events()
        assert e.host == "other.test"
