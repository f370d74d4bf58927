"""The real vLLM engine (CPU build) on a tiny dense Qwen3 with tied embeddings.

One server for the module: multi-turn tool episodes through the engine are token-exact, weight syncs
(file and bytes transport) bring engine log-probs to the trainer's within 1e-4, a kill mid-call is a
one-line error within the timeout, and a killed parent leaves no engine process or shared memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from cadenza.errors import CadenzaError, EngineError
from cadenza.rl.engines import make_engine
from cadenza.rl.engines.policy import HFPolicy, SampleRequest, SamplingParams, tiny_qwen3_config
from cadenza.rl.engines.vllm_server import _group_pids
from cadenza.rl.learn.sft import SFTConfig, encode_messages, supervised_finetune
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from cadenza.rl.text.chat import assistant_message, parse_tool_calls
from tests.support.engine_helpers import TOL, check_sync_parity, hf_logprobs, requires_vllm, save
from tests.support.rl_helpers import TOOLS, CounterEnv, make_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]

TEMPERATURE = 0.7


def _transcript(target: int, steps: list[int]) -> list[dict]:
    messages = CounterEnv(target).reset()
    total = 0
    for x in [*steps, None]:
        name, args = ("submit", {}) if x is None else ("add", {"x": x})
        text = f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'.replace("'", '"')
        calls = parse_tool_calls(text)
        messages.append(assistant_message(text, calls))
        total += x or 0
        result = "submitted" if x is None else f"counter = {total}"
        messages.append({"role": "tool", "tool_call_id": calls[0].id, "name": name, "content": result})
    return messages


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny tied-embedding Qwen3 (head_dim 32) that learnt the tool-call format, served by vLLM."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = make_tokenizer()
    policy = HFPolicy.from_config(tiny_qwen3_config(len(tok), head_dim=32, tie_word_embeddings=True), seed=0)
    data = [encode_messages(tok, _transcript(3, s), TOOLS) for s in ([1, 2], [2, 1], [1, 1, 1], [3])]
    losses = supervised_finetune(policy, tok, data * 4, SFTConfig(steps=40, batch_size=8, lr=1e-2, warmup=5))
    assert losses[-1] < losses[0] / 3
    policy.model.eval()
    path = save(policy, tok, tmp_path_factory.mktemp("dense"))
    engine = make_engine(
        "vllm", model=str(path), max_model_len=1024, request_timeout_s=120, sync_timeout_s=60
    )
    try:
        yield tok, policy, engine, path
    finally:
        engine.close()
        torch.set_num_threads(threads)


def test_multi_turn_tool_episodes_are_token_exact(setup):
    tok, policy, engine, _ = setup
    cfg = RolloutParams(group_size=4, max_turns=4, max_new_tokens=40, temperature=TEMPERATURE)
    tasks = [RolloutTask(task_id="count3", make_env=CounterEnv)]
    out = rollout(engine, tok, tasks, cfg)
    assert max(len(r.trajectory.turns) for r in out) >= 2, "no multi-turn tool episode was sampled"
    for r in out:
        t = r.tokens
        t.validate()
        # the engine's behaviour log-probs (temperature applied) equal the trainer's over the stored ids:
        # the engine saw exactly these tokens as context, observation tokens included
        ref = hf_logprobs(policy, t.input_ids, temperature=TEMPERATURE)
        for turn, (start, end) in zip(r.trajectory.turns, t.turn_spans, strict=True):
            assert t.input_ids[start:end] == turn.token_ids
            got = torch.tensor(turn.logprobs)
            assert float((got - ref[start - 1 : end - 1]).abs().max()) <= TOL
    again = rollout(engine, tok, tasks, cfg)  # per-request seeds from the rollout seed: reproducible
    assert [r.tokens.input_ids for r in again] == [r.tokens.input_ids for r in out]


def test_sample_tags_version_and_stops_on_stop_ids(setup):
    tok, _, engine, _ = setup
    prompt = tok.encode("counter = 1 2 3", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=30, temperature=1.0, stop_token_ids=(tok.eos_token_id,))
    out = engine.sample(SampleRequest([prompt] * 3, params, torch.Generator().manual_seed(1)))
    for s in out:
        assert s.policy_version == engine.version
        assert len(s.token_ids) == len(s.logprobs) >= 1
        if s.finish_reason == "stop":
            assert s.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in s.token_ids[:-1]
        else:
            assert len(s.token_ids) == 30 and tok.eos_token_id not in s.token_ids


def test_many_seeded_prompts_in_one_batch(setup):
    """More prompt tokens than one scheduler step takes (vLLM 0.32.0 on CPU crashed on this with
    chunked prefill and per-request seeds); the batch equals the same prompts sampled one by one."""
    _, _, engine, _ = setup
    prompts = [[(7 * i + j) % 300 + 3 for j in range(60)] for i in range(48)]
    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    batch = engine.sample(SampleRequest(prompts, params, torch.Generator().manual_seed(5)))
    seeds_gen = torch.Generator().manual_seed(5)
    assert len(batch) == 48 and all(len(s.token_ids) == 3 for s in batch)
    first = engine.sample(SampleRequest(prompts[:1], params, seeds_gen))  # same first seed: same draw
    assert first[0].token_ids == batch[0].token_ids


def test_weight_sync_parity_file_then_bytes(setup):
    tok, policy, engine, _ = setup
    seqs = [encode_messages(tok, _transcript(3, [1, 2]), TOOLS).input_ids, list(range(5, 60))]
    check_sync_parity(engine, policy, seqs, steps=1, lr=0.1)
    engine.config.transport = "bytes"
    try:
        check_sync_parity(engine, policy, seqs, steps=1, lr=0.1, first_version=2)
    finally:
        engine.config.transport = "file"
    group = set(_group_pids(engine.server.proc.pid))
    left = [p for p in Path("/dev/shm").glob("cadenza-stage-*") if int(p.name.rsplit("-", 1)[1]) in group]
    assert not left, f"staged bytes left in shared memory: {left}"


def test_engine_core_is_forked_not_spawned(setup):
    """vLLM's CPU platform spawns its engine core, which then imports vLLM and torch a second time;
    cadenza's launcher forks it (one import per start). A forked child maps torch where its parent
    does; a spawned one is a new exec, placed elsewhere by ASLR (vLLM renames the process, so its
    command line cannot tell)."""
    if Path("/proc/sys/kernel/randomize_va_space").read_text().strip() == "0":
        pytest.skip("ASLR is off: a spawned process maps torch at the same address as a forked one")
    engine = setup[2]
    bases = {}
    for pid in _group_pids(engine.server.proc.pid):
        with contextlib.suppress(OSError):
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
            hits = [m.split("-")[0] for m in maps if m.endswith("/libtorch_cpu.so")]
            if hits:
                bases[pid] = hits[0]
    assert len(bases) == 2, bases  # the API server and the engine core load torch (the supervisor does not)
    assert len(set(bases.values())) == 1, f"the engine core was spawned, not forked: {bases}"


def test_sync_that_runs_out_of_time_is_one_line_error(setup):
    _, policy, engine, _ = setup
    engine.config.sync_timeout_s = 1e-6
    try:
        with pytest.raises(EngineError, match=r"^engine 'vllm' weight sync took longer than") as err:
            engine.sync_weights(policy.model.named_parameters(), version=engine.version + 1)
    finally:
        engine.config.sync_timeout_s = 60
    assert "\n" not in str(err.value) and "log: " in str(err.value)
    assert engine.server.alive()  # the engine keeps serving; the trainer decides what to do


def test_engine_that_fails_to_start_names_its_log(setup, tmp_path):
    path = setup[3]
    broken = tmp_path / "broken"
    broken.mkdir()
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    (broken / "config.json").write_text(json.dumps(cfg))
    log = tmp_path / "server.log"
    t0 = time.monotonic()
    with pytest.raises(CadenzaError, match=r"^engine 'vllm' exited during start-up: .*\(log: ") as err:
        make_engine("vllm", model=str(broken), log_path=str(log), startup_timeout_s=240)
    assert time.monotonic() - t0 < 240 and "\n" not in str(err.value) and str(log) in str(err.value)


def test_kill_mid_call_is_one_line_error(setup):
    _, _, engine, _ = setup
    errors: list[BaseException] = []
    params = SamplingParams(max_new_tokens=900, temperature=1.0)

    def call() -> None:
        try:
            engine.sample(SampleRequest([[5, 6, 7]] * 8, params, torch.Generator().manual_seed(0)))
        except BaseException as e:
            errors.append(e)

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(1.0)
    pgid = engine.server.proc.pid
    os.killpg(pgid, signal.SIGKILL)
    t0 = time.monotonic()
    worker.join(timeout=60)
    assert not worker.is_alive(), "sample() hung after the engine was killed"
    assert time.monotonic() - t0 < 30
    assert len(errors) == 1 and isinstance(errors[0], EngineError), errors
    msg = str(errors[0])
    assert "\n" not in msg and "engine 'vllm'" in msg and str(engine.log_path) in msg
    # the API server dies first (that failed the call); its supervisor may still be exiting under load
    engine.server.proc.wait(timeout=30)
    with pytest.raises(CadenzaError, match="not running"):
        engine.sync_weights(iter(()), version=99)
    engine.close()
    assert not _group_pids(pgid)


CHILD = """
import json, sys, urllib.request
from cadenza.rl.engines.vllm_server import VLLMServer, VLLMServerConfig, _group_pids, _shm_mapped
if __name__ == "__main__":
    server = VLLMServer(VLLMServerConfig(model=sys.argv[1], max_model_len=1024))
    server.start()  # what make_engine("vllm") starts, without importing torch here
    pgid = server.proc.pid
    print("READY", pgid, *sorted(_shm_mapped(_group_pids(pgid))), flush=True)
    url, head = f"{server.base_url}/v1/completions", {"Content-Type": "application/json"}
    body = json.dumps({"model": "cadenza", "prompt": [[5, 6, 7]] * 4, "max_tokens": 200}).encode()
    while True:
        urllib.request.urlopen(urllib.request.Request(url, body, head), timeout=120).read()
"""


def test_no_orphan_after_parent_is_killed(setup, tmp_path):
    path = setup[3]
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen(
        [sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    pgid = None
    try:
        line = child.stdout.readline().split()
        assert line and line[0] == "READY", line
        pgid, shm = int(line[1]), line[2:]
        assert _group_pids(pgid), "the engine group is not running"
        time.sleep(2.0)  # mid-generation
        child.kill()
        child.wait(timeout=30)
        deadline = time.monotonic() + 40
        while _group_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _group_pids(pgid), "engine processes outlived the killed parent"
        assert not [f for f in shm if os.path.exists(f)], "the engine's /dev/shm segments were left behind"
    finally:
        if child.poll() is None:
            child.kill()
        if pgid is not None and _group_pids(pgid):
            os.killpg(pgid, signal.SIGKILL)
