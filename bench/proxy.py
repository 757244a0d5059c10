"""What the filtering proxy adds to a connection on loopback.

Times N rounds of: TCP connect, send 1 byte, receive it back, close; to an
echo server on loopback directly, through the proxy's HTTP CONNECT and
through its SOCKS5 (rounds interleaved, so load drifts hit all three
alike).  The proxy resolves a test name to 127.0.0.1 with a resolver
mapping and allows it with an allow entry for 127.0.0.1.  Prints the
median of each and what the proxy adds.  The resolver is a mapping,
looked up in place; a last column times CONNECT with the same table behind
a function, which the proxy calls on its thread pool as it does
getaddrinfo (the default), to show what that hop costs.

The client and the echo server are processes of their own, as a sandbox
and a remote server are: in this process they would contend with the
proxy's thread for the GIL, which is not what is measured.

    python bench/proxy.py [--n 2000]
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from sbxlimit._proxy import ProxyLimits, ProxyServer, Rules

NAME = "echo.bench.test"


def echo_server() -> None:
    """Role: a single-threaded echo server on loopback; prints its port."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    print(listener.getsockname()[1], flush=True)
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is listener:
                conn, _ = listener.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sel.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            if data:
                sock.sendall(data)  # 1 byte: never blocks
            else:
                sel.unregister(sock)
                sock.close()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise ConnectionError("closed early")
        got += chunk
    return got


def round_trip(address: tuple[str, int], handshake: Callable[[socket.socket], None]) -> float:
    t0 = time.perf_counter()
    with socket.create_connection(address) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake(s)
        s.sendall(b"x")
        if s.recv(1) != b"x":
            raise RuntimeError("bad echo")
    return time.perf_counter() - t0


def client(n: int, port: int, proxy_port: int, pooled_port: int) -> None:
    """Role: the rounds; prints the times as JSON."""
    proxy = ("127.0.0.1", proxy_port)
    connect_head = f"CONNECT {NAME}:{port} HTTP/1.1\r\nHost: {NAME}:{port}\r\n\r\n".encode()
    established = b"HTTP/1.1 200 Connection established\r\n\r\n"
    socks_request = b"\x05\x01\x00\x03" + bytes((len(NAME),)) + NAME.encode() + port.to_bytes(2)

    def connect(s: socket.socket) -> None:
        s.sendall(connect_head)
        if recv_exactly(s, len(established)) != established:
            raise RuntimeError("CONNECT refused")

    def socks(s: socket.socket) -> None:
        # Greeting and request in one write, as clients that know the
        # server takes no authentication do.
        s.sendall(b"\x05\x01\x00" + socks_request)
        if recv_exactly(s, 12)[:4] != b"\x05\x00\x05\x00":
            raise RuntimeError("SOCKS refused")

    kinds: dict[str, tuple[tuple[str, int], Callable[[socket.socket], None]]] = {
        "direct": (("127.0.0.1", port), lambda s: None),
        "CONNECT": (proxy, connect),
        "SOCKS5": (proxy, socks),
        "CONNECT, resolver on the pool": (("127.0.0.1", pooled_port), connect),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for address, handshake in kinds.values():  # warm up
        for _ in range(50):
            round_trip(address, handshake)
    for i in range(n):
        order = list(kinds)
        order = order[i % len(order) :] + order[: i % len(order)]
        for k in order:
            address, handshake = kinds[k]
            times[k].append(round_trip(address, handshake))
    print(json.dumps(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="rounds of each (default 2000)")
    ap.add_argument("--role", choices=("echo", "client"), help=argparse.SUPPRESS)
    ap.add_argument("--ports", type=int, nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "echo":
        echo_server()
        return
    if args.role == "client":
        client(args.n, *args.ports)
        return

    echo = subprocess.Popen(
        [sys.executable, __file__, "--role", "echo"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert echo.stdout is not None
        port = int(echo.stdout.readline())
        table = {NAME: ["127.0.0.1"]}
        servers = [
            ProxyServer(resolver=table),
            ProxyServer(resolver=lambda host, _port: table[host]),
        ]
        listeners = [socket.create_server(("127.0.0.1", 0), backlog=256) for _ in servers]
        ports = [str(listener.getsockname()[1]) for listener in listeners]
        served = [
            server.serve(
                "bench",
                listener,
                Rules.parse([NAME, "127.0.0.1"]),
                ProxyLimits(connections=None),
                lambda _e: None,
            )
            for server, listener in zip(servers, listeners, strict=True)
        ]
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--role",
                "client",
                "--n",
                str(args.n),
                "--ports",
                str(port),
                *ports,
            ],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        ).stdout
        for s in served:
            s.close()
        for server in servers:
            server.close()
    finally:
        echo.kill()
        echo.wait()
    times = json.loads(out)
    direct = statistics.median(times["direct"])
    print(f"{args.n} rounds each: connect + 1-byte echo + close, on loopback (median)")
    print(f"  {'direct':<30} {direct * 1e6:8.1f} us")
    for k in ("CONNECT", "SOCKS5", "CONNECT, resolver on the pool"):
        m = statistics.median(times[k])
        print(f"  {k:<30} {m * 1e6:8.1f} us   adds {(m - direct) * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
