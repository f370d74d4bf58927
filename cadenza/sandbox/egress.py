"""Network for the install phase that reaches the package registry and nothing else.

bubblewrap can share the host's network namespace or give a sandbox its own, not filter by host. So an
install sandbox gets its own namespace (no route out, and none of the host's loopback services) plus a
Unix socket bound in from the host: :mod:`cadenza.sandbox.relay` forwards the sandbox's proxy traffic
to it, and :class:`RegistryProxy` here answers only ``CONNECT`` to the registry's (host, port) pairs,
connecting out itself (through the host's own ``HTTPS_PROXY`` when one is set). Anything else (another
host, another port, a plain ``GET``) gets ``403`` and is recorded in :attr:`RegistryProxy.refused`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

from cadenza.sandbox import relay

#: The relay program the sandbox runs (bound read-only at its own path).
RELAY_PROGRAM = relay.__file__
HEAD_LIMIT = 16384


def registry_endpoints(env: dict[str, str]) -> set[tuple[str, int]] | None:
    """The (host, port) pairs pip's settings in ``env`` reach over TLS; ``None`` when one is plain
    ``http://`` (a proxy cannot keep such a registry apart from other hosts: the caller falls back)."""
    urls = env.get("PIP_INDEX_URL", "https://pypi.org/simple").split()
    urls += env.get("PIP_EXTRA_INDEX_URL", "").split() + env.get("PIP_FIND_LINKS", "").split()
    out: set[tuple[str, int]] = set()
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme == "http":
            return None
        if parts.scheme == "https" and parts.hostname:
            out.add((parts.hostname.lower(), parts.port or 443))
    if ("pypi.org", 443) in out:
        out.add(("files.pythonhosted.org", 443))  # where pypi.org's index links the files
    return out


def _read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data and len(data) < HEAD_LIMIT:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


class RegistryProxy:
    """A ``CONNECT``-only proxy on a Unix socket that lets through exactly ``allowed``."""

    def __init__(self, allowed: set[tuple[str, int]], *, timeout_s: float = 60.0) -> None:
        self.allowed = {(h.lower(), p) for h, p in allowed}
        self.timeout_s = timeout_s
        self.refused: list[str] = []
        self.upstream = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or ""
        self._dir = Path(tempfile.mkdtemp(prefix="cadenza-egress-"))
        self.socket_path = str(self._dir / "proxy.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def __enter__(self) -> RegistryProxy:
        self._server.bind(self.socket_path)
        self._server.listen(64)
        threading.Thread(target=self._accept, daemon=True, name="cadenza-egress").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def socket_dir(self) -> str:
        return str(self._dir)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(self.timeout_s)
        try:
            head = _read_head(conn)
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, _, rest = line.partition(" ")
            target = rest.split(" ", 1)[0]
            host, _, port = target.rpartition(":")
            host = host.strip("[]").lower()
            ok = method == "CONNECT" and port.isdigit() and (host, int(port)) in self.allowed
            if not ok:
                self.refused.append(line[:200])
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                conn.close()
                return
            up = self._connect(host, int(port))
            if extra := head.partition(b"\r\n\r\n")[2]:
                up.sendall(extra)
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            conn.settimeout(None)
            up.settimeout(None)
            threading.Thread(target=relay.pipe, args=(up, conn), daemon=True).start()
            relay.pipe(conn, up)
        except OSError:
            with contextlib.suppress(OSError):
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    def _connect(self, host: str, port: int) -> socket.socket:
        if not self.upstream:
            return socket.create_connection((host, port), timeout=self.timeout_s)
        parts = urlsplit(self.upstream if "://" in self.upstream else "http://" + self.upstream)
        up = socket.create_connection((parts.hostname or "", parts.port or 80), timeout=self.timeout_s)
        up.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        reply = _read_head(up)
        if b" 200" not in reply.split(b"\r\n", 1)[0]:
            up.close()
            raise OSError(f"upstream proxy refused {host}:{port}")
        return up
