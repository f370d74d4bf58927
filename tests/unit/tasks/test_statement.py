"""Statements: the optional LLM writer talks to a real local OpenAI-compatible HTTP endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from cadenza.tasks.deletion.delete import plan_deletion
from cadenza.tasks.deletion.features import Candidate, module_files
from cadenza.tasks.deletion.statement import template_statement, write_statement
from cadenza.tasks.sources.source import describe_source
from tests.support.tasks_helpers import make_repo


@pytest.fixture
def deletion(tmp_path: Path):
    root = make_repo(tmp_path / "r")
    cand = Candidate(
        qualname="minilib.core.mul",
        module="minilib.core",
        local="mul",
        path="minilib/core.py",
        kind="function",
        lineno=1,
        end_lineno=1,
        body_lines=4,
    )
    return plan_deletion(root, cand, 2, module_files(describe_source(str(root), root)))


def _serve(answer: str):
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_llm_writer_is_used_when_clean(deletion) -> None:
    server, seen = _serve("Please restore `mul`: multiply two numbers. Tests: tests/test_core.py::test_mul")
    try:
        text = write_statement(
            deletion, ["tests/test_core.py::test_mul"], llm_url=f"http://127.0.0.1:{server.server_port}/v1"
        )
    finally:
        server.shutdown()
    assert text.startswith("Please restore `mul`")
    assert seen and seen[0]["messages"][-1]["content"].count("tests/test_core.py::test_mul") == 1
    assert "result = add(result, a)" not in json.dumps(seen)  # the removed body never leaves the machine


def test_llm_answer_with_removed_code_falls_back_to_template(deletion) -> None:
    server, _ = _serve("Implement it like this:\n    result = add(result, a)\n")
    try:
        text = write_statement(
            deletion, ["tests/test_core.py::test_mul"], llm_url=f"http://127.0.0.1:{server.server_port}"
        )
    finally:
        server.shutdown()
    assert text == template_statement(deletion, ["tests/test_core.py::test_mul"])


def test_unreachable_llm_falls_back_and_default_needs_no_network(deletion) -> None:
    text = write_statement(deletion, ["tests/test_core.py::test_mul"], llm_url="http://127.0.0.1:9/v1")
    assert text == write_statement(deletion, ["tests/test_core.py::test_mul"])
    assert "is missing from `minilib/core.py`" in text and "def mul(a, b):" in text
    assert "Multiply two numbers by repeated addition." in text
