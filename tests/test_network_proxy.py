"""Network by name: a real sandbox whose one way out is sbxlimit's filtering
proxy (``Policy(network="proxy", allow_domains=...)``), attacked from the
inside.  Real servers on the host, names the test maps for the proxy (its
resolver), real connections from a program in the sandbox's own network
namespace; as root and unprivileged (a user namespace then)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

import sbxlimit
from sbxlimit import _proxy
from sbxlimit._namespaces import CLONE_NEWNET, namespaces

from .test_proxy import NO_OPENSSL, make_test_ca

PY = sys.executable

pytestmark = pytest.mark.skipif(
    not namespaces(CLONE_NEWNET).ok,
    reason=f"no network namespace here: {namespaces(CLONE_NEWNET).reason}",
)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from the host\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _outside_address() -> str:
    """This host's address on its outward interface (not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only a route is chosen
            return str(s.getsockname()[0])
        except OSError:
            pytest.skip("no outward interface with an IPv4 address here")
    raise AssertionError("unreachable")


@pytest.fixture
def web() -> Iterator[int]:
    """An HTTP server on every host address (loopback and the outward one)."""
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Hello)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def names(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[str]]]:
    """The proxy's view of DNS for this test: name -> addresses."""
    table: dict[str, list[str]] = {}

    def resolve(host: str, port: int) -> list[str]:
        if host in table:
            return table[host]
        raise OSError(f"{host}: not a name this test knows")

    server = _proxy.ProxyServer(resolver=resolve)
    monkeypatch.setattr(_proxy, "shared", lambda: server)
    try:
        yield table
    finally:
        server.close()


# The program in the sandbox: fetch a URL through the proxy the environment
# names (urllib reads HTTP_PROXY), print the status or the error.
FETCH = """
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
        print(r.status, r.read().decode().strip())
except Exception as e:
    print("error", getattr(e, "code", None) or type(e).__name__)
"""

# A raw CONNECT through the proxy on the sandbox's loopback, then a request.
CONNECT = """
import os, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
s = socket.create_connection(("127.0.0.1", int(proxy[1])), timeout=10)
s.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
head = s.recv(4096).split(b"\\r\\n")[0].decode()
print(head)
if " 200 " in head:
    s.sendall(f"GET / HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n".encode())
    print(s.recv(4096).split(b"\\r\\n")[0].decode())
"""

# SOCKS5 with a name, as socks5h:// clients do.
SOCKS = """
import os, socket, struct, sys
host, port = sys.argv[1].encode(), int(sys.argv[2])
proxy = os.environ["ALL_PROXY"].rsplit(":", 1)
s = socket.create_connection(("127.0.0.1", int(proxy[1])), timeout=10)
s.sendall(b"\\x05\\x01\\x00")
assert s.recv(2) == b"\\x05\\x00"
s.sendall(b"\\x05\\x01\\x00\\x03" + bytes([len(host)]) + host + struct.pack("!H", port))
reply = s.recv(10)
print("socks", reply[1])
if reply[1] == 0:
    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    print(s.recv(4096).split(b"\\r\\n")[0].decode())
"""

# Around the proxy: straight to the host's outward address (TCP and UDP),
# and a name resolved inside the sandbox.
AROUND = """
import socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
for what, make in (
    ("tcp", lambda: socket.create_connection((addr, port), timeout=3)),
    ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", (addr, port))),
    ("dns", lambda: socket.getaddrinfo("example.com", 80)),
):
    try:
        make()
        print(what, "reached")
    except OSError as e:
        print(what, "refused", e.errno)
"""


def _run(
    code: str, *args: str, policy: sbxlimit.Policy
) -> tuple[list[str], sbxlimit.SandboxResult]:
    r = sbxlimit.run(
        [PY, "-c", code, *args], capture_output=True, text=True, policy=policy, timeout=60
    )
    assert r.returncode == 0, (r.stdout, r.stderr, r.enforced.get("network"))
    return r.stdout.splitlines(), r


def _policy(*allow: str, **kw: object) -> sbxlimit.Policy:
    return sbxlimit.Policy(network="proxy", allow_domains=allow, **kw)  # type: ignore[arg-type]


def test_an_allowed_name_is_reached_by_http_connect_and_socks(web, names):
    names["allowed.test"] = ["127.0.0.1"]
    # The loopback address itself is listed: a name resolving into the
    # host's loopback is otherwise refused (below).
    policy = _policy("allowed.test", "127.0.0.1")
    out, r = _run(FETCH, f"http://allowed.test:{web}/", policy=policy)
    assert out == ["200 hello from the host"]
    out, _ = _run(CONNECT, "allowed.test", str(web), policy=policy)
    assert out == ["HTTP/1.1 200 Connection established", "HTTP/1.0 200 OK"] or (
        out[0].split()[1] == "200" and out[1].split()[1] == "200"
    ), out
    out, _ = _run(SOCKS, "allowed.test", str(web), policy=policy)
    assert out[0] == "socks 0" and out[1].split()[1] == "200", out
    assert r.enforced["network"].held
    assert sbxlimit.Mechanism.NETNS in r.enforced["network"].mechanisms
    allowed = [e for e in r.network if e.event == "net_allowed"]
    assert [(e.host, e.port, e.protocol) for e in allowed] == [("allowed.test", web, "http")]
    assert allowed[0].bytes_down > 0


@pytest.mark.skipif(NO_OPENSSL, reason="needs the openssl command line")
def test_https_end_to_end_with_a_test_ca(names, tmp_path):
    # TLS from the program to the server, through CONNECT: the program
    # checks the server's certificate against a CA made here.
    make_test_ca(str(tmp_path))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(tmp_path / "srv.pem"), str(tmp_path / "srv.key"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        names["tls.test"] = ["127.0.0.1"]
        fetch = FETCH.replace(
            "urlopen(sys.argv[1], timeout=10)",
            "urlopen(sys.argv[1], timeout=10, context=__import__('ssl')"
            ".create_default_context(cafile=sys.argv[2]))",
        )
        url = f"https://tls.test:{server.server_address[1]}/"
        out, r = _run(fetch, url, str(tmp_path / "ca.pem"), policy=_policy("tls.test", "127.0.0.1"))
        assert out == ["200 hello from the host"]
        (e,) = r.network
        assert (e.event, e.protocol, e.host) == ("net_allowed", "connect", "tls.test")
    finally:
        server.shutdown()
        server.server_close()


def test_other_names_and_ip_literals_are_refused_and_logged(web, names):
    names["allowed.test"] = ["127.0.0.1"]
    names["other.test"] = ["127.0.0.1"]
    outside = _outside_address()
    policy = _policy("allowed.test", "127.0.0.1")
    out, r = _run(CONNECT, "other.test", str(web), policy=policy)
    assert out[0].split()[1] == "403", out
    out, r2 = _run(CONNECT, outside, str(web), policy=policy)  # an IP literal, not listed
    assert out[0].split()[1] == "403", out
    out, r3 = _run(SOCKS, "other.test", str(web), policy=policy)
    assert out == ["socks 2"]
    denied = [(e.event, e.host, e.port) for e in (*r.network, *r2.network, *r3.network)]
    assert denied == [
        ("net_denied", "other.test", web),
        ("net_denied", outside, web),
        ("net_denied", "other.test", web),
    ]


def test_a_name_rebound_to_the_hosts_loopback_is_refused(web, names):
    # DNS rebinding: an allowed name that resolves to 127.0.0.1 would reach
    # the host's loopback services (databases, metadata proxies).
    names["rebind.test"] = ["127.0.0.1"]
    out, r = _run(CONNECT, "rebind.test", str(web), policy=_policy("rebind.test"))
    assert out[0].split()[1] == "403", out
    (e,) = r.network
    assert e.event == "net_denied" and e.host == "rebind.test" and e.reason


def test_nothing_gets_around_the_proxy(web, names):
    # Straight to the host's outward address by TCP or UDP, or a DNS lookup
    # of the sandbox's own: the namespace has only its loopback.
    outside = _outside_address()
    out, r = _run(AROUND, outside, str(web), policy=_policy("allowed.test"))
    assert [line.split()[:2] for line in out] == [
        ["tcp", "refused"],
        ["udp", "refused"],
        ["dns", "refused"],
    ], out
    assert r.network == []


def test_the_audit_sees_every_attempt(web, names):
    names["allowed.test"] = ["127.0.0.1"]
    seen: list[sbxlimit.audit.Event] = []
    unsubscribe = sbxlimit.audit.subscribe(seen.append)
    try:
        _run(FETCH, f"http://allowed.test:{web}/", policy=_policy("allowed.test", "127.0.0.1"))
        _run(CONNECT, "nope.test", "443", policy=_policy("allowed.test"))
    finally:
        unsubscribe()
    net = [(e.name, e.host, e.port) for e in seen if e.name.startswith("net_")]
    assert net == [("net_allowed", "allowed.test", web), ("net_denied", "nope.test", 443)]
    assert all(e.sandbox_id for e in seen if e.name.startswith("net_"))


def test_the_proxy_ends_with_the_program(web, names, tmp_path):
    # What the program leaves running in its namespace cannot use the way
    # out once the program has ended.
    names["allowed.test"] = ["127.0.0.1"]
    out = tmp_path / "late"
    late = (
        "import os, sys, time\n"
        "time.sleep(1)\n"
        "try:\n"
        f"    exec({CONNECT!r})\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
        "print('end', flush=True)\n"
    )
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {late!r}, 'allowed.test', '{web}'],"
        " start_new_session=True, stdout=open(sys.argv[1], 'w'), stderr=subprocess.STDOUT)\n"
    )
    # No cgroup and no PID namespace, so that nothing else ends it: the
    # late one outlives the program (a new session leaves the tree).
    policy = _policy(
        "allowed.test", "127.0.0.1", writable_roots=[str(tmp_path)], isolate_pids=False
    )
    r = sbxlimit.run([PY, "-c", code, str(out)], policy=policy, timeout=60, cgroup_parent="none")
    assert r.returncode == 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "end" not in out.read_text():
        time.sleep(0.05)
    text = out.read_text()
    assert "end" in text and "200" not in text, text  # it ran, and never got through


def test_the_cli_prints_refused_destinations(tmp_path):
    code = "import os, socket; s = socket.create_connection(('127.0.0.1', 3128)); " + (
        "s.sendall(b'CONNECT evil.example:443 HTTP/1.1\\r\\n\\r\\n'); print(s.recv(100)[:12])"
    )
    r = subprocess.run(
        [PY, "-m", "sbxlimit", "run", "--allow-domain", "pypi.org", "--json", "--", PY, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "sbxlimit: network: refused evil.example:443" in r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["policy"]["network"] == "proxy"
    assert [(e["event"], e["host"]) for e in doc["network"]] == [("net_denied", "evil.example")]


def test_asyncio_gives_the_same_log(web, names):
    import asyncio

    import sbxlimit.asyncio as sbx_asyncio

    names["allowed.test"] = ["127.0.0.1"]

    async def main() -> sbxlimit.SandboxResult:
        return await sbx_asyncio.run(
            [PY, "-c", CONNECT, "nope.test", "443"],
            capture_output=True,
            policy=_policy("allowed.test"),
        )

    r = asyncio.run(main())
    assert r.returncode == 0, r.stderr
    assert [(e.event, e.host) for e in r.network] == [("net_denied", "nope.test")]


def _forked_fetch() -> int:
    import urllib.request

    try:
        urllib.request.urlopen("http://nope.test/", timeout=10)
    except Exception as e:
        return 3 if getattr(e, "code", None) == 403 else 4  # refused by the proxy, or not
    return 5


def test_a_forked_body_finds_the_proxy_too(names):
    # A callable (the pytest marker's body) is not exec'd: the proxy's
    # variables must reach its os.environ all the same.
    from sbxlimit._forked import ForkedSandbox

    p = ForkedSandbox(_forked_fetch, policy=_policy("allowed.test"))
    assert p.wait() == 3
    assert [(e.event, e.host) for e in p.network_log()] == [("net_denied", "nope.test")]
    assert "HTTP_PROXY" not in os.environ or os.environ["HTTP_PROXY"] != "http://127.0.0.1:3128"
