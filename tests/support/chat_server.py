"""A local HTTP server speaking the chat-completions protocol with scripted replies.

A test double for the protocol only: ``policy(request_body) -> reply`` decides each answer; a reply
is an assistant message dict, a tool call shorthand, an ``(status, body_bytes)`` pair for errors or
garbage, or ``("sleep", seconds)`` to simulate a hung server.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Policy = Callable[[dict[str, Any]], Any]


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    """An assistant message with one tool call (arguments JSON-encoded as servers send them)."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{name}_{time.monotonic_ns()}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class ChatServer:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.requests: list[dict[str, Any]] = []
        self.retry_after: str | None = None  # sent with error statuses when set
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server.lock:
                    server.requests.append(body)
                reply = server.policy(body)
                if isinstance(reply, tuple) and reply[0] == "sleep":
                    time.sleep(reply[1])
                    reply = {"role": "assistant", "content": "late"}
                if isinstance(reply, tuple):
                    status, raw = reply
                else:
                    status, raw = 200, json.dumps(completion(reply)).encode()
                self.send_response(status)
                if status >= 400 and server.retry_after is not None:
                    self.send_header("Retry-After", server.retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                with suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def start(self) -> None:
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def serve(policy: Policy) -> Iterator[ChatServer]:
    server = ChatServer(policy)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def scripted(turns: list[Any]) -> Policy:
    """Reply with ``turns[k]`` where k counts assistant messages already in the request (one script per
    conversation)."""

    def policy(body: dict[str, Any]) -> Any:
        k = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        return turns[min(k, len(turns) - 1)]

    return policy


def closed_port_url() -> str:
    """A URL nothing listens on (a port bound then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
