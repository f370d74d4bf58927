"""The install phase's registry-only network: the host-side proxy lets through CONNECT to the
registry's (host, port) pairs and nothing else (real sockets on loopback)."""

from __future__ import annotations

import socket
import threading

from cadenza.sandbox.egress import RegistryProxy, registry_endpoints


def _echo_server() -> tuple[socket.socket, int]:
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def _ask(proxy: RegistryProxy, head: str) -> tuple[bytes, socket.socket]:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(10)
    c.connect(proxy.socket_path)
    c.sendall(head.encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = c.recv(4096)
        if not chunk:
            break
        reply += chunk
    return reply, c


def test_only_connect_to_the_registry_gets_through():
    allowed, port = _echo_server()
    other, other_port = _echo_server()
    with allowed, other, RegistryProxy({("127.0.0.1", port)}, timeout_s=10) as proxy:
        reply, c = _ask(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 200")
        c.sendall(b"hello")
        assert c.recv(5) == b"hello"  # the tunnel reaches the registry
        c.close()
        for head in (
            f"CONNECT 127.0.0.1:{other_port} HTTP/1.1\r\n\r\n",  # another port of an allowed host
            f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n",  # another name
            f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n",  # not a tunnel
        ):
            reply, c = _ask(proxy, head)
            c.close()
            assert reply.startswith(b"HTTP/1.1 403"), (head, reply)
        assert len(proxy.refused) == 3


def test_registry_endpoints_follow_the_pip_settings():
    assert registry_endpoints({}) == {("pypi.org", 443), ("files.pythonhosted.org", 443)}
    env = {"PIP_INDEX_URL": "https://mirror.example:8443/simple", "PIP_FIND_LINKS": "/opt/wheels"}
    assert registry_endpoints(env) == {("mirror.example", 8443)}
    env = {"PIP_EXTRA_INDEX_URL": "file:///opt/pypi/simple https://extra.example/simple"}
    assert ("extra.example", 443) in registry_endpoints(env)
    assert registry_endpoints({"PIP_INDEX_URL": "http://plain.example/simple"}) is None
