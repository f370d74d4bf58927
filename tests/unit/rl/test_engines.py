"""Engine pieces that need no vLLM server: weight streaming (FSDP2 included), the hf engine, the openai
client against a local HTTP server, and the errors raised before any engine process starts."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import torch

from cadenza.errors import CadenzaError, ConfigError, ContextLengthExceeded, EngineError
from cadenza.rl.engines import make_engine
from cadenza.rl.engines import vllm_server as vs
from cadenza.rl.engines.engine import RolloutEngine
from cadenza.rl.engines.openai import OpenAIEngine, OpenAIEngineConfig, parse_choice
from cadenza.rl.engines.policy import (
    HFPolicy,
    SampleRequest,
    SamplingParams,
    tiny_qwen3_config,
    tiny_qwen3_moe_config,
)
from cadenza.rl.engines.weights import buckets, engine_names, named_full_tensors
from cadenza.testing import spawn
from tests.support.chat_server import closed_port_url, serve


def _moe(seed: int = 0) -> HFPolicy:
    return HFPolicy.from_config(tiny_qwen3_moe_config(64, head_dim=32), seed=seed)


def test_engine_names_are_the_checkpoint_format(tmp_path):
    """Per-expert tensors saved as a checkpoint load back (transformers restacks them) to the same model."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    src = _moe()
    named = list(engine_names(named_full_tensors(src.model)))
    names = [n for n, _ in named]
    assert "model.layers.0.mlp.experts.7.up_proj.weight" in names
    assert not any(n.endswith("experts.gate_up_proj") for n in names)
    src.model.config.save_pretrained(tmp_path)
    save_file({n: t.contiguous().clone() for n, t in named}, str(tmp_path / "model.safetensors"))
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    ids = torch.arange(1, 30)[None]
    with torch.no_grad():
        assert torch.equal(back(ids).logits, src.model(ids).logits)


def test_buckets_are_bounded_and_keep_order():
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 30, 5, 100, 1, 1])]  # float32: 4 B each
    out = list(buckets(named, bucket_bytes=160))
    assert [n for b in out for n, _ in b] == [n for n, _ in named]
    for b in out:
        size = sum(t.numel() * 4 for _, t in b)
        assert size <= 160 or len(b) == 1  # a tensor larger than a bucket travels alone
    with pytest.raises(CadenzaError):
        list(buckets(named, bucket_bytes=0))


def _fsdp_full(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ref = _moe(seed=3).model
    model = _moe(seed=3).model
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert any(hasattr(p, "full_tensor") for p in model.parameters())
    expected = dict(ref.named_parameters())
    from cadenza.rl.engines.gpu_sync import ModuleWeights

    # the native GPU transfer declares global names/shapes up front, without a gather
    assert ModuleWeights(model).metadata() == ModuleWeights(ref).metadata()
    got = 0
    for name, t in named_full_tensors(model):  # every rank iterates: each full_tensor() is a collective
        assert not hasattr(t, "full_tensor") and torch.equal(t, expected[name].detach()), name
        got += 1
    return {"tensors": got, "expected": len(expected)}


@pytest.mark.distributed  # two gloo ranks: make test runs it, make test-fast does not
def test_named_full_tensors_gathers_fsdp2_shards():
    for r in spawn(_fsdp_full, 2, preload=("torch", "transformers.models.qwen3_moe.modeling_qwen3_moe")):
        assert r["tensors"] == r["expected"]


def test_hf_engine_samples_with_its_own_copy_until_synced():
    trainer = HFPolicy.from_config(tiny_qwen3_moe_config(64), seed=0)
    engine = make_engine("hf", policy=trainer)
    assert isinstance(engine, RolloutEngine) and engine.version == 0
    params = SamplingParams(max_new_tokens=6)
    prompts = [[1, 2, 3], [4, 5]]

    def draw(policy):
        return policy.sample(SampleRequest(prompts, params, torch.Generator().manual_seed(0)))

    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p))
    stale = draw(engine)
    assert all(s.policy_version == 0 for s in stale)
    assert [s.logprobs for s in stale] != [s.logprobs for s in draw(trainer)]
    engine.sync_weights(engine_names(trainer.model.named_parameters()), version=1)  # per-expert names load
    fresh = draw(engine)
    assert [s.logprobs for s in fresh] == [s.logprobs for s in draw(trainer)]
    assert all(s.policy_version == 1 for s in fresh) and engine.version == 1
    with pytest.raises(CadenzaError, match="no weight named"):
        engine.sync_weights([("nope.weight", torch.zeros(1))], version=2)
    engine.close()
    with pytest.raises(CadenzaError, match="closed"):
        engine.sample(SampleRequest(prompts, params))


def test_make_engine_rejects_bad_names_and_options():
    with pytest.raises(ConfigError, match="unknown engine"):
        make_engine("sglang")
    with pytest.raises(ConfigError, match="unknown vllm engine option"):
        make_engine("vllm", model="/x", prot=1)
    with pytest.raises(ConfigError, match="needs policy"):
        make_engine("hf")


def test_vllm_errors_before_any_process_starts(tmp_path):
    policy = HFPolicy.from_config(tiny_qwen3_config(64), seed=0)  # head_dim 16: CPU vLLM cannot run it
    policy.model.save_pretrained(str(tmp_path))
    with pytest.raises(CadenzaError, match=r"head_dim 16 .* needs >= 32"):
        vs.check_model(tmp_path, cpu=True)
    if vs.vllm_installed() and vs.vllm_is_cpu_build():  # and the server refuses it before spawning anything
        server = vs.VLLMServer(vs.VLLMServerConfig(model=str(tmp_path)))
        with pytest.raises(CadenzaError, match="head_dim 16"):
            server.start()
        assert server.proc is None
    with socket.socket() as s:  # a port in use
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(CadenzaError, match=f"port {port} on 127.0.0.1 is in use"):
            vs.check_port("127.0.0.1", port)
    with pytest.raises(CadenzaError, match=r"no config\.json"):
        vs.check_model(tmp_path / "missing", cpu=False)
    # the trainer's own interpreter has no vLLM (it lives in the engine venv): a real "not installed"
    if not vs._probe(sys.executable):  # (unless vLLM was installed here with --same-env)
        with pytest.raises(CadenzaError, match=r"not installed for .*; install it with: python -m cadenza"):
            make_engine("vllm", model=str(tmp_path), python=sys.executable)


def test_the_server_supervisor_starts_without_torch():
    """``python -m cadenza.rl.engines.vllm_server`` runs before every vLLM start: importing torch there
    cost 3-7 s per engine start (and its memory for the server's lifetime)."""
    code = "import sys, cadenza.rl.engines.vllm_server; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def _reply(choice: dict) -> tuple[int, bytes]:
    return 200, json.dumps({"choices": [choice]}).encode()


def test_openai_engine_token_ids_seeds_and_errors():
    seen = []

    def policy(body):
        seen.append(body)
        n = min(3, body["max_tokens"])
        toks = [f"token_id:{body['prompt'][-1] + i}" for i in range(n)]
        return _reply({"logprobs": {"tokens": toks, "token_logprobs": [-0.5] * n}, "finish_reason": "length"})

    with serve(policy) as srv:
        eng = OpenAIEngine(OpenAIEngineConfig(base_url=srv.url.removesuffix("/v1"), model="m", timeout_s=5))
        out = eng.sample(
            SampleRequest([[1, 2], [7]], SamplingParams(max_new_tokens=3), torch.Generator().manual_seed(0))
        )
        assert [s.token_ids for s in out] == [[2, 3, 4], [7, 8, 9]] and out[0].logprobs == [-0.5] * 3
        assert sorted(b["prompt"] for b in seen) == [[1, 2], [7]]  # token ids in, never text
        seeds = sorted(b["seed"] for b in seen)
        seen.clear()
        eng.sample(
            SampleRequest([[1, 2], [7]], SamplingParams(max_new_tokens=3), torch.Generator().manual_seed(0))
        )
        assert sorted(b["seed"] for b in seen) == seeds and len(set(seeds)) == 2
        with pytest.raises(CadenzaError, match="cannot load new weights"):
            eng.sync_weights(iter(()), version=1)
    with pytest.raises(EngineError, match="returned no token ids"):
        parse_choice({"choices": [{"text": "hi", "logprobs": None, "finish_reason": "stop"}]}, "openai")
    with serve(lambda body: ("sleep", 3)) as srv:
        eng = OpenAIEngine(OpenAIEngineConfig(base_url=srv.url.removesuffix("/v1"), model="m", timeout_s=0.5))
        with pytest.raises(EngineError, match=r"engine 'openai' generation failed: no answer within"):
            eng.sample(SampleRequest([[1]], SamplingParams(max_new_tokens=2)))
    with serve(lambda body: (400, b'{"error": {"message": "maximum context length is 8 tokens"}}')) as srv:
        eng = OpenAIEngine(OpenAIEngineConfig(base_url=srv.url.removesuffix("/v1"), model="m", timeout_s=5))
        with pytest.raises(ContextLengthExceeded, match="maximum context length"):  # not an engine failure
            eng.sample(SampleRequest([[1]], SamplingParams(max_new_tokens=2)))
    eng = OpenAIEngine(
        OpenAIEngineConfig(base_url=closed_port_url().removesuffix("/v1"), model="m", timeout_s=5)
    )
    with pytest.raises(EngineError, match=r"^engine 'openai' generation failed: .*refused"):
        eng.sample(SampleRequest([[1]], SamplingParams(max_new_tokens=2)))
