"""Chat template, locally trained tokenizer, tool-call parsing."""

from __future__ import annotations

import json

import pytest

from cadenza.errors import CadenzaError
from cadenza.rl.text.chat import (
    CHAT_TEMPLATE,
    assistant_message,
    load_tokenizer,
    parse_tool_calls,
    render,
    render_continuation,
    require_chat_template,
    train_tokenizer,
    turn_end_glue,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "view",
            "description": "show a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tok():
    corpus = [
        "def f(x):\n    return x + 1\n",
        'view the file {"path": "src/a.py"}',
        "Reminder: tools are view",
    ] * 30
    return train_tokenizer(corpus, vocab_size=420)


def _conversation():
    calls = parse_tool_calls(
        'Let me look.<tool_call>\n{"name": "view", "arguments": {"path": "a.py"}}\n</tool_call>'
    )
    return [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix a.py"},
        assistant_message("Let me look.", calls),
        {"role": "tool", "tool_call_id": "call_0", "content": "x = 1"},
        {"role": "tool", "tool_call_id": "call_1", "content": "second"},
        {"role": "user", "content": "go on"},
    ]


def test_template_renders_hermes_style(tok):
    text = render(tok, _conversation(), TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou fix bugs.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert (
        "<|im_start|>assistant\nLet me "
        'look.\n<tool_call>\n{"name": "view", "arguments": {"path": "a.py"}}\n</tool_call><|im_end|>\n'
        in text
    )
    # consecutive tool results share one user turn
    assert (
        "<|im_start|>user\n<tool_response>\nx = "
        "1\n</tool_response>\n<tool_response>\nsecond\n</tool_response><|im_end|>\n" in text
    )
    assert text.endswith("<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n")


def test_special_tokens_are_single_ids_and_text_round_trips(tok):
    for t in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|pad|>"):
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] != tok.unk_token_id
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    text = render(tok, _conversation(), TOOLS) + "ünïcode ✓ \t tabs"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_save_and_load_keep_template_and_ids(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    assert again.chat_template == CHAT_TEMPLATE
    text = render(tok, _conversation(), TOOLS, add_generation_prompt=True)
    assert again.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)


def test_continuation_is_exact_suffix(tok):
    conv = _conversation()
    delta = render_continuation(tok, conv[:3], conv[3:5], TOOLS)
    assert render(tok, conv[:3], TOOLS) + delta == render(tok, conv[:5], TOOLS, add_generation_prompt=True)
    assert turn_end_glue(tok, conv[:3], TOOLS) == "\n"


def test_missing_chat_template_is_a_user_error(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    bare = AutoTokenizer.from_pretrained(str(tmp_path))
    bare.chat_template = None
    with pytest.raises(CadenzaError, match="no chat template"):
        require_chat_template(bare)
    with pytest.raises(CadenzaError, match="no chat template"):
        render(bare, _conversation())


def test_vocab_too_small_is_a_user_error():
    with pytest.raises(CadenzaError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>{"name": "view", "arguments": {"path": "a"}}</tool_call>', [("view", {"path": "a"})]),
        (
            'a<tool_call>{"name":"x","arguments":{}}</tool_call>b<tool_call>{"name":"y","arguments":{"k":1}}</tool_call>',
            [("x", {}), ("y", {"k": 1})],
        ),
        (
            '<tool_call>{"name": "view", "arguments": "{\\"path\\": \\"b\\"}"}</tool_call>',
            [("view", {"path": "b"})],
        ),
        ('<tool_call>{"name": "view", "arguments": {"path": "a"</tool_call>', [("view", '{"path": "a"')]),
        ('<tool_call>{"name": "view", "arguments": {"path": "a"}</tool_call>', [("view", {"path": "a"})]),
        ('<tool_call>{"name": "view", "arguments": [1, 2]}</tool_call>', [("view", "[1, 2]")]),
        ("<tool_call>not json at all</tool_call>", [("", "not json at all")]),
        ('<tool_call>{"name": "edit", "arguments": {"a": ', [("edit", '{"a":')]),  # cut off by max tokens
        ("plain answer, no calls", []),
    ],
)
def test_parse_tool_calls_robust(text, expected):
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == expected
    assert len({c.id for c in calls}) == len(calls)


def test_assistant_message_keeps_raw_arguments():
    calls = parse_tool_calls('<tool_call>{"name": "view", "arguments": {"path": "a"</tool_call>')
    msg = assistant_message('<tool_call>{"name": "view"...', calls)
    assert msg["content"] == ""
    assert msg["tool_calls"][0]["function"] == {"name": "view", "arguments": '{"path": "a"'}


def test_template_that_rewrites_history_is_rejected(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    unstable = AutoTokenizer.from_pretrained(str(tmp_path))
    # announces the number of messages up front, so appending a message changes earlier text
    unstable.chat_template = "{{ messages | length }}{% for m in messages %}|{{ m['content'] }}{% endfor %}"
    conv = _conversation()
    with pytest.raises(CadenzaError, match="prefix-stable"):
        render_continuation(unstable, conv[:2], conv[2:3])


def test_load_tokenizer_checks(tok, tmp_path):
    tok.save_pretrained(tmp_path / "ok")
    assert load_tokenizer(tmp_path / "ok").chat_template == CHAT_TEMPLATE
    with pytest.raises(CadenzaError, match="not a directory"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CadenzaError):
        load_tokenizer(tmp_path / "empty")
    tok.save_pretrained(tmp_path / "bare")
    for name in ("chat_template.jinja",):
        (tmp_path / "bare" / name).unlink(missing_ok=True)
    import json

    cfg_path = tmp_path / "bare" / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CadenzaError, match="no chat template"):
        load_tokenizer(tmp_path / "bare")


def test_memoised_render_is_the_template_s_and_follows_template_and_input_changes(tok):
    conv = _conversation()

    def fresh(messages, template=None):
        return tok.apply_chat_template(
            messages, tools=TOOLS, tokenize=False, chat_template=template or tok.chat_template
        )

    for n in range(1, len(conv) + 1):
        assert render(tok, conv[:n], TOOLS) == render(tok, conv[:n], TOOLS) == fresh(conv[:n])
    reordered = [dict(reversed(list(m.items()))) for m in conv]  # same keys, other order: other JSON
    assert render(tok, reordered, TOOLS) == fresh(reordered)
    edited = [*conv[:-1], {**conv[-1], "content": conv[-1]["content"] + " (edited)"}]
    assert render(tok, edited, TOOLS) == fresh(edited) != render(tok, conv, TOOLS)
    old = tok.chat_template
    try:
        tok.chat_template = old.replace("<|im_start|>system", "<|im_start|>SYSTEM")
        assert render(tok, conv, TOOLS) == fresh(conv) != fresh(conv, old)  # not the cached old render
    finally:
        tok.chat_template = old
    assert render(tok, conv, TOOLS) == fresh(conv)
