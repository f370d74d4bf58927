"""Chat format with tool calls (Qwen/Hermes style), a locally trained tokenizer, and tool-call parsing.

Assistant turns carry tool calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
tool results come back in a user turn as ``<tool_response>...</tool_response>``; the available tools
are listed in the system message. The template is a Jinja string stored with the tokenizer, so
``save_pretrained``/``from_pretrained`` keep it and any HF tokenizer with a compatible template
(e.g. a real Qwen checkpoint) works with the same rollout code.

Rendering for rollouts is *incremental* (:func:`render_continuation`): the text added by new messages
is the difference between two renders of the template, so prompt/observation tokens concatenate to
exactly what the model saw while model tokens stay the ids it sampled.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from cadenza.agent.env import ToolCall
from cadenza.errors import CadenzaError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (
    IM_START,
    IM_END,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
    PAD,
)

# Qwen2.5/Hermes-style template. Consecutive tool messages share one user turn; a tool call's
# arguments are emitted verbatim when they are a string (the model produced non-JSON) and as JSON otherwise.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages and messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for tc in message.get('tool_calls') or [] %}"
    "{%- set fn = tc['function'] if tc['function'] is defined else tc %}"
    "{%- if (loop.first and message['content']) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}"
    "{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 512,
    *,
    min_frequency: int = 1,
    chat_template: str = CHAT_TEMPLATE,
    extra_special_tokens: Sequence[str] = (),
) -> Any:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it as a HF ``PreTrainedTokenizerFast``.

    Byte-level means any string round-trips through encode/decode, which rollouts rely on. The chat
    special tokens are single ids, so ``<|im_end|>`` can serve as the generation stop token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys([*SPECIAL_TOKENS, *extra_special_tokens]))
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(specials):
        raise CadenzaError(
            f"vocab_size={vocab_size} is too small: a byte-level tokenizer needs at least "
            f"{len(alphabet) + len(specials)}; pass a larger vocab_size"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        chat_template=chat_template,
        additional_special_tokens=[t for t in specials if t not in (IM_END, PAD)],
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(path: str | Path) -> Any:
    """Load a tokenizer saved with ``save_pretrained`` (local only) and check it can render tool chats."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise CadenzaError(
            f"tokenizer path {str(path)!r} is not a directory; pass a save_pretrained directory"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise CadenzaError(
            f"cannot load a tokenizer from {str(path)!r}: {str(exc).splitlines()[0]}"
        ) from None
    require_chat_template(tokenizer)
    if tokenizer.eos_token_id is None:
        raise CadenzaError(
            f"tokenizer at {str(path)!r} has no eos token; set eos_token to the end-of-turn token"
        )
    return tokenizer


def require_chat_template(tokenizer: Any) -> None:
    """Raise a CadenzaError before any compute when the tokenizer cannot render chats."""
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise CadenzaError(
            f"tokenizer {name!r} has no chat template; give it one (tokenizer.chat_template = "
            "cadenza.rl.text.chat.CHAT_TEMPLATE) or use a model whose tokenizer_config ships one"
        )


def render(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
) -> str:
    """Render ``messages`` with the tokenizer's chat template (text, not ids).

    Memoised: an incremental rollout renders each history two or three times (as the end of one
    continuation, the start of the next, for the turn-end glue), and a Jinja render costs ~1 ms."""
    require_chat_template(tokenizer)
    key = _render_key(tokenizer, messages, tools, add_generation_prompt)
    with _RENDERED_LOCK:
        text = _RENDERED.get(key) if key is not None else None
        if text is not None:
            _RENDERED.move_to_end(key)
            return text
    text = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    if key is not None:
        with _RENDERED_LOCK:
            _RENDERED[key] = text
            while len(_RENDERED) > _RENDER_CACHE_SIZE:
                _RENDERED.popitem(last=False)
    return text


_RENDER_CACHE_SIZE = 256  # ~3 live renders per in-flight episode; each entry holds one rendered text
_RENDERED: OrderedDict[tuple[Any, ...], str] = OrderedDict()
_RENDERED_LOCK = threading.Lock()  # rollouts render from worker threads


def _render_key(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, gen: bool
) -> tuple[Any, ...] | None:
    """What a render depends on: the template, the special tokens it may print, the inputs (a digest of
    their JSON, which keeps key order as ``tojson`` shows it). None when the inputs are not JSON (then
    nothing is cached)."""
    try:
        inputs = json.dumps([list(messages), list(tools) if tools else None], ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    specials = json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True, default=str)
    digest = hashlib.blake2b(inputs.encode(), digest_size=20).digest()
    return (tokenizer.chat_template, specials, gen, digest)


def render_continuation(
    tokenizer: Any,
    history: Sequence[dict[str, Any]],
    new: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> str:
    """Text that ``new`` messages (plus the generation prompt) add after ``history``.

    Requires the template to be prefix-stable: rendering ``history`` must be a prefix of rendering
    ``history + new``; a template that rewrites earlier turns cannot be used for multi-turn RL.
    """
    before = render(tokenizer, history, tools) if history else ""
    after = render(tokenizer, [*history, *new], tools, add_generation_prompt=add_generation_prompt)
    if not after.startswith(before):
        raise CadenzaError(
            "the chat template re-renders earlier turns when messages are appended (not prefix-stable); "
            "use a template like cadenza.rl.text.chat.CHAT_TEMPLATE for multi-turn rollouts"
        )
    return after[len(before) :]


def turn_end_glue(
    tokenizer: Any, history: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> str:
    """Text the template puts after the end-of-turn token of the last assistant message (e.g. ``"\\n"``).

    The model stops at the end-of-turn token; what follows it belongs to the next (observation) segment.
    """
    text = render(tokenizer, history, tools)
    eos = tokenizer.eos_token
    if not eos or eos not in text:
        raise CadenzaError(
            f"the chat template does not end assistant turns with the tokenizer's eos token {eos!r}; "
            "set tokenizer.eos_token to the end-of-turn token (e.g. <|im_end|>)"
        )
    return text[text.rindex(eos) + len(eos) :]


_TOOL_CALL_RE = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.DOTALL
)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Extract ``<tool_call>`` blocks from model output, tolerating malformed JSON.

    A block holds one call object (Hermes/Qwen: ``{"name": ..., "arguments": {...}}``) or a JSON list of
    them (SmolLM2's format: ``[{"name": ...}, ...]``), one call per element.
    A block whose body is not such JSON still yields a call: the name is
    recovered with a regex where possible (else ``""``, which no tool matches) and the arguments are
    kept as the raw string so the environment can answer ``invalid_arguments`` / ``tool_not_found``.
    An unterminated final block (the model ran out of tokens) is parsed the same way.
    """
    calls: list[ToolCall] = []
    for match in _TOOL_CALL_RE.finditer(text):
        body = match.group(1).strip()
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, RecursionError):
            obj = None
        if obj == []:  # an empty list: the model says no call is needed
            continue
        items = obj if isinstance(obj, list) and obj else [obj]
        if all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in items):
            calls += [_call(o, f"call_{len(calls) + i}") for i, o in enumerate(items)]
            continue
        if body.startswith("["):  # a malformed list: salvage its first call
            body = body[1:].removesuffix("]").strip()
        name_match = re.search(r'"name"\s*:\s*"([^"\\]*)"', body)
        args_match = re.search(r'"arguments"\s*:\s*(.*)$', body, re.DOTALL)
        calls.append(
            ToolCall(
                name=name_match.group(1) if name_match else "",
                arguments=_salvage_arguments(args_match.group(1)) if args_match else body,
                id=f"call_{len(calls)}",
            )
        )
    return calls


def _call(obj: dict[str, Any], call_id: str) -> ToolCall:
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            decoded = json.loads(args)
            args = decoded if isinstance(decoded, dict) else args
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict | str):
        args = json.dumps(args)
    return ToolCall(name=obj["name"], arguments=args, id=call_id)


def assistant_message(text: str, calls: Sequence[ToolCall]) -> dict[str, Any]:
    """OpenAI-format assistant message for decoded model output ``text`` (tool-call blocks moved to
    ``tool_calls``)."""
    content = text.split(TOOL_CALL_OPEN, 1)[0].strip()
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments),
                },
            }
            for c in calls
        ]
    return msg


def _salvage_arguments(raw: str) -> dict[str, Any] | str:
    """Arguments text cut out of a malformed call: a JSON object if one is recoverable, else the raw text."""
    raw = raw.strip()
    for candidate in (raw, raw[:-1].rstrip() if raw.endswith("}") else None):
        if candidate is None:
            continue
        try:
            obj = json.loads(candidate)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(obj, dict):
            return obj
    if raw.endswith("}") and raw.count("}") > raw.count("{"):
        raw = raw[:-1].rstrip()
    return raw
