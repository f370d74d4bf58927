"""The registry relay's in-sandbox half: stdlib only, run from this file with ``python -I -S``.

A sandbox of the install phase has its own network namespace (loopback only). This program listens on
the namespace's 127.0.0.1, forwards every connection to a Unix socket bound in from the host, where
:class:`cadenza.sandbox.egress.RegistryProxy` lets through only ``CONNECT`` to the package registry, and
runs the command with ``HTTP(S)_PROXY`` pointing at itself; it exits with the command's exit status.
Importing this module does nothing.

    python -I -S relay.py SOCKET -- CMD...
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either end closes, then shut both down."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _serve(listener: socket.socket, upstream: str) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        try:
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(upstream)
        except OSError:
            conn.close()
            continue
        threading.Thread(target=pipe, args=(conn, up), daemon=True).start()
        threading.Thread(target=pipe, args=(up, conn), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: relay.py SOCKET -- CMD...")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    threading.Thread(target=_serve, args=(listener, argv[0]), daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    env = dict(os.environ)
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env[key] = url
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    return subprocess.call(argv[2:], env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
