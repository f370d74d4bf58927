"""Problem statements written from what a developer could legitimately know.

Inputs: the feature's qualified name, kind and location, its signature and docstring (the public
contract), for classes/modules the public API headers, and the failing tests' node IDs. Never
the removed body. The optional LLM writer (any OpenAI-compatible ``/chat/completions``
endpoint) only rephrases those facts, and its answer is discarded if it reproduces any removed
snippet; by default no network is used.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from cadenza.tasks.deletion.delete import Deletion

MAX_TESTS_LISTED = 30

_KIND_WORD = {"function": "function", "method": "method", "class": "class", "module": "module"}


def template_statement(deletion: Deletion, fail_to_pass: list[str]) -> str:
    """The default, offline statement."""
    cand = deletion.candidate
    kind = _KIND_WORD[cand.kind]
    owner = ""
    if cand.kind == "method":
        owner = f" of class `{cand.module}.{cand.local.rsplit('.', 1)[0]}`"
    lines: list[str] = []
    if deletion.level == 1:
        lines.append(
            f"The {kind} `{cand.qualname}`{owner} in `{cand.path}` currently raises `NotImplementedError`. "
            "Implement it so that it behaves as documented and the failing tests pass."
        )
    elif cand.kind == "module":
        lines.append(
            f"The module `{cand.qualname}` (file `{cand.path}`) is missing from the package. "
            "Recreate it, and wire it back into the package wherever it is imported, so the failing "
            "tests pass."
        )
    elif cand.kind == "method":
        lines.append(
            f"The method `{cand.qualname}`{owner} is missing from `{cand.path}`. "
            "Add it back to the class so the failing tests pass."
        )
    else:
        what = "Recreate it with its methods" if cand.kind == "class" else "Add it back"
        lines.append(
            f"The {kind} `{cand.qualname}` is missing from `{cand.path}`. "
            f"{what}, and export it again wherever the package exposed it, so the failing tests pass."
        )
    if cand.kind != "module":
        lines += ["", "Signature:", "", "```python", deletion.signature, "```"]
    if deletion.docstring:
        lines += ["", "Documentation:", "", _indent(deletion.docstring)]
    if deletion.api:
        label = "Public members" if cand.kind == "class" else "Public definitions"
        lines += ["", f"{label} it should provide:", "", "```python", *deletion.api, "```"]
    if deletion.level > 1:
        removed = sorted({n for names in deletion.removed_names.values() for n in names} - {cand.local})
        if removed:
            lines += ["", "Names that were exported with it: " + ", ".join(f"`{n}`" for n in removed)]
    lines += ["", f"Tests that must pass ({len(fail_to_pass)}):", ""]
    lines += [f"- `{t}`" for t in fail_to_pass[:MAX_TESTS_LISTED]]
    if len(fail_to_pass) > MAX_TESTS_LISTED:
        lines.append(f"- ... and {len(fail_to_pass) - MAX_TESTS_LISTED} more")
    lines += ["", "All other tests must keep passing. Do not modify the tests."]
    return "\n".join(lines) + "\n"


def _indent(text: str) -> str:
    return "\n".join(f"    {ln}" if ln else "" for ln in text.splitlines())


def leaks(statement: str, deletion: Deletion) -> list[str]:
    """Removed-code snippets (body lines) that appear in ``statement``; the docstring is allowed."""
    allowed = (deletion.docstring or "") + "\n" + deletion.signature + "\n" + "\n".join(deletion.api)
    out = []
    for line in deletion.removed_code.splitlines():
        s = line.strip()
        if len(s) >= 12 and s in statement and s not in allowed:
            out.append(s)
    return out


def llm_statement(
    deletion: Deletion, fail_to_pass: list[str], *, url: str, model: str = "default", timeout_s: float = 60.0
) -> str | None:
    """Ask an OpenAI-compatible endpoint to rewrite the template; None on any failure or leak."""
    facts = template_statement(deletion, fail_to_pass)
    body = {
        "model": model,
        "temperature": 0.2,
        "messages": [
            {
                "role": "system",
                "content": "You write concise issue descriptions for software tasks. Never include code "
                "that implements the feature; describe behaviour only, using the facts given.",
            },
            {
                "role": "user",
                "content": f"Rewrite this task description as a clear issue, keeping the signature and "
                f"the test list verbatim:\n\n{facts}",
            },
        ],
    }
    req = urllib.request.Request(
        url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            text = json.loads(resp.read())["choices"][0]["message"]["content"]
    except (urllib.error.URLError, TimeoutError, KeyError, IndexError, ValueError, OSError):
        return None
    if not isinstance(text, str) or not text.strip() or leaks(text, deletion):
        return None
    return text.strip() + "\n"


def write_statement(
    deletion: Deletion, fail_to_pass: list[str], *, llm_url: str | None = None, llm_model: str = "default"
) -> str:
    """The task statement: LLM-written when ``llm_url`` is given and it answers cleanly, else the template."""
    if llm_url:
        text = llm_statement(deletion, fail_to_pass, url=llm_url, model=llm_model)
        if text:
            return text
    return template_statement(deletion, fail_to_pass)
