"""Rollout engines: tokens/s of ``hf`` vs ``vllm`` on the same model, prompts and sampling, and the
seconds one in-place weight sync takes. Prints ONE JSON object.

    python bench/rollout.py                        # tiny Qwen3 + SmolLM2-135M, CPU
    python bench/rollout.py --device cuda          # on a GPU machine (see bench/gpu.sh)
    python bench/rollout.py --steps-per-min        # also RL steps/min by staleness (bench/async_steps.py)
    python bench/rollout.py --background-load 2    # each engine idle and beside 2 busy processes
    python bench/rollout.py --background-load 2 --vllm-env OMP_NUM_THREADS=1   # engine env to try

Targets (issue 11): vLLM >= 1.5x HF on SmolLM2-135M on this CPU; sync < 1 s (tiny), < 5 s (135M).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from cadenza.rl.engines import make_engine
from cadenza.rl.engines.policy import HFPolicy, SampleRequest, SamplingParams, tiny_qwen3_config
from cadenza.rl.engines.weights import named_full_tensors


def _tiny(out: Path) -> tuple[HFPolicy, list[list[int]]]:
    from cadenza.rl.text.chat import train_tokenizer

    tok = train_tokenizer(["counter = 1 2 3; add x then submit."] * 50, vocab_size=300)
    policy = HFPolicy.from_config(tiny_qwen3_config(len(tok), head_dim=32), seed=0)
    policy.model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    gen = torch.Generator().manual_seed(0)
    return policy, [torch.randint(3, len(tok), (32,), generator=gen).tolist() for _ in range(64)]


def _smollm2(out: Path) -> tuple[HFPolicy, list[list[int]], Path]:
    from transformers import AutoTokenizer

    from cadenza.rl.models import ensure_smollm2

    path = (
        Path(os.environ["CADENZA_SMOLLM2_DIR"]) if os.environ.get("CADENZA_SMOLLM2_DIR") else ensure_smollm2()
    )
    tok = AutoTokenizer.from_pretrained(str(path))
    tasks = ["add two numbers", "reverse a list", "count vowels in a string", "parse an integer"]
    prompts = [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": f"Write a Python function to {tasks[i % 4]}."}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        for i in range(64)
    ]
    return HFPolicy.from_pretrained(path), prompts, path


def _tokens_per_s(engine, prompts: list[list[int]], new_tokens: int) -> float:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)  # no stop ids: every sample is full
    engine.sample(
        SampleRequest(prompts[:2], SamplingParams(max_new_tokens=4), torch.Generator().manual_seed(1))
    )
    t0 = time.perf_counter()
    out = engine.sample(SampleRequest(prompts, params, torch.Generator().manual_seed(0)))
    return sum(len(s.token_ids) for s in out) / (time.perf_counter() - t0)


class BusyLoad:
    """A fixed competing CPU job: ``n`` single-threaded busy-loop processes (started and stopped here)."""

    def __init__(self, n: int, nice: int = 0) -> None:
        self.n, self.nice, self.procs = n, nice, []

    def __enter__(self) -> BusyLoad:
        code = f"import os; os.nice({self.nice})\nwhile True: pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.n)]
        if self.n:
            time.sleep(1.0)  # let the scheduler see them
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(timeout=10)


def _under_load(engines: dict, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    """Each engine's tokens/s idle and beside the busy job, rounds interleaved (best of each kept)."""
    res = {e: {"idle": 0.0, "load": 0.0} for e in engines}
    loadavg = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for phase in ("idle", "load"):
            with BusyLoad(args.background_load if phase == "load" else 0, args.background_nice):
                for name, engine in engines.items():
                    tps = _tokens_per_s(engine, prompts, args.tokens)
                    res[name][phase] = max(res[name][phase], tps)
                    print(f"{name} {phase}: {tps:.1f} tok/s", file=sys.stderr, flush=True)
                loadavg.append(os.getloadavg()[0])
    for r in res.values():
        r["kept"] = r["load"] / r["idle"] if r["idle"] else 0.0
    return {**res, "loadavg_1m": [round(x, 2) for x in loadavg]}


def bench_model(name: str, args: argparse.Namespace, work: Path) -> dict:
    if name == "tiny":
        policy, prompts = _tiny(work / name)
        path = work / name
    else:
        policy, prompts, path = _smollm2(work / name)
    policy.model.to(args.device)
    policy.device = torch.device(args.device)
    prompts = prompts[: args.samples]
    hf = make_engine("hf", policy=policy)
    log = Path(args.log_dir or work) / f"{name}-vllm.log"
    t0 = time.perf_counter()
    env = dict(kv.split("=", 1) for kv in args.vllm_env)
    vllm = make_engine(
        "vllm",
        model=str(path),
        max_model_len=2048,
        log_path=str(log),
        extra_env=env,
        startup_timeout_s=args.vllm_start_timeout,
    )
    res: dict = {"vllm_start_s": time.perf_counter() - t0, "hf": 0.0, "vllm": 0.0}
    try:
        if args.background_load:
            return {**res, "under_load": _under_load({"hf": hf, "vllm": vllm}, prompts, args)}
        # alternate the engines and keep each one's best round: the machine is shared, so a slow round
        # says more about the neighbours than about the engine
        for _ in range(args.rounds):
            res["hf"] = max(res["hf"], _tokens_per_s(hf, prompts, args.tokens))
            res["vllm"] = max(res["vllm"], _tokens_per_s(vllm, prompts, args.tokens))
        syncs = []
        for step in range(1, args.syncs + 1):
            t0 = time.perf_counter()
            vllm.sync_weights(named_full_tensors(policy.model), version=step)
            syncs.append(time.perf_counter() - t0)
        res["sync_s"] = sorted(syncs)[len(syncs) // 2]  # median
    finally:
        vllm.close()
        hf.close()
    res["params_m"] = sum(p.numel() for p in policy.model.parameters()) / 1e6
    return res


def steps_per_min() -> dict | None:
    """RL steps/min at max_staleness 0, 1, 2: provided by ``bench/async_steps.py`` (the async trainer)."""
    script = Path(__file__).with_name("async_steps.py")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=1800, check=True
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return data.get("steps_per_min", data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="alternating hf/vllm rounds (best kept)")
    ap.add_argument("--device", default="cpu", help="device of the hf engine and the trainer copy")
    ap.add_argument("--log-dir", default=None, help="keep the engine logs here (default: a temp dir)")
    ap.add_argument(
        "--no-steps-per-min", dest="steps_per_min", action="store_false", help="skip bench/async_steps.py"
    )
    ap.add_argument(
        "--background-load",
        type=int,
        default=0,
        help="N > 0: tokens/s idle and beside N busy processes, interleaved (no sync, no steps)",
    )
    ap.add_argument("--vllm-start-timeout", type=float, default=900.0, help="seconds (a loaded machine)")
    ap.add_argument("--background-nice", type=int, default=0, help="niceness of the busy processes")
    ap.add_argument("--vllm-env", action="append", default=[], metavar="KEY=VALUE",
                    help="added to the vLLM engine's environment (e.g. OMP_NUM_THREADS=1)")  # fmt: skip
    args = ap.parse_args()
    if args.background_load:
        return main_load(args)
    results: dict = {"tokens_per_s": {}, "weight_sync_s": {}, "vllm_over_hf": {}, "detail": {}}
    with tempfile.TemporaryDirectory(prefix="cadenza-bench-") as tmp:
        for name in args.models.split(","):
            r = bench_model(name, args, Path(tmp))
            results["tokens_per_s"][name] = {"hf": round(r["hf"], 1), "vllm": round(r["vllm"], 1)}
            results["weight_sync_s"][name] = round(r["sync_s"], 3)
            results["vllm_over_hf"][name] = round(r["vllm"] / r["hf"], 2)
            results["detail"][name] = {
                k: round(v, 2) for k, v in r.items() if k.endswith("_s") or k == "params_m"
            }
    results["steps_per_min"] = steps_per_min() if args.steps_per_min else None
    results["setup"] = {
        "samples": args.samples,
        "new_tokens": args.tokens,
        "device": args.device,
        "torch_threads": torch.get_num_threads(),
        "rounds": args.rounds,
    }
    print(json.dumps(results))


def main_load(args: argparse.Namespace) -> None:
    """``--background-load N``: both engines idle and beside the competing job, and the fraction kept."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    results: dict = {"commit": commit.stdout.strip(), "background_load": args.background_load,
                     "background_nice": args.background_nice}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="cadenza-bench-") as tmp:
        for name in args.models.split(","):
            r = bench_model(name, args, Path(tmp))
            load = r.pop("under_load")
            results[name] = {
                e: {k: round(v, 3 if k == "kept" else 1) for k, v in load[e].items()} for e in ("hf", "vllm")
            }
            results[name]["loadavg_1m"] = load["loadavg_1m"]
            results[name]["vllm_start_s"] = round(r["vllm_start_s"], 1)
    results["setup"] = {"samples": args.samples, "new_tokens": args.tokens, "rounds": args.rounds,
                        "torch_threads": torch.get_num_threads(), "vllm_env": dict(
                            kv.split("=", 1) for kv in args.vllm_env), "cores": os.cpu_count()}  # fmt: skip
    print(json.dumps(results))


if __name__ == "__main__":
    main()
