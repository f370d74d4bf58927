"""The whole pipeline at toy scale: ``cadenza demo``.

tasks from a real PyPI package (the task factory, resumable) -> a tiny policy (tokenizer trained here,
a short SFT warm-up on generated transcripts of the agent tools' call format so that a random model
emits parseable tool calls) -> ``cadenza.rl.train.trainer.Trainer`` over the ``taskset`` env source
(curriculum sampling, sandboxed episodes, grading, monitor, feedback hints, GRPO + self-distillation,
pool recording and escalation) -> a short report. ``model`` switches the policy to a local HF
checkpoint for real runs on a GPU; nothing here is a separate training path.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from cadenza.errors import CadenzaError

# Fixed pieces of the tool-call JSON as single tokens (a tiny BPE cannot merge across punctuation splits).
CALL_PIECES = (
    '{"name": "',
    '", "arguments": ',
    '{"path": "',
    '{"selector": "',
    '{"command": "',
    '"}}',
    "{}}",
)
WORKSPACE = "/tmp/cadenza-ep/workspace"


@dataclass(kw_only=True)
class DemoConfig:
    """The real-task phase of ``make demo`` at toy scale on 2 CPU cores (measured times: docs/curriculum.md).

    The demo's second phase, toolworld (GRPO vs GRPO + SD), is :mod:`cadenza.experiments.demo`; the two
    together take about 5 minutes on an idle 2-core machine with a warm environment cache."""

    out: Path = Path("runs/demo")  # run directory: tasks/, policy/, train/, pass_rates.png
    source: str | None = None  # default: cadenza.tasks.builder.demo.DEMO_SOURCE
    max_tasks: int = 6  # tasks to build (``cadenza demo --tasks-only`` builds DEMO_MAX_TASKS = 12)
    levels: tuple[int, ...] = (1, 2)  # escalation asks the factory for level 3 when the pool goes easy
    steps: int = 3  # RL steps
    tasks_per_step: int = 2  # tasks per RL step
    group_size: int = 4  # rollouts per task (a GRPO group)
    max_turns: int = 3  # tool calls per episode
    max_new_tokens: int = 40  # tokens per model turn
    transcripts: int = 200  # generated call-format transcripts of the tiny policy's SFT warm-up
    sft_steps: int = 30  # SFT warm-up steps of the tiny policy
    vocab_size: int = 600  # vocabulary of the tokenizer trained here
    model: str | None = (
        None  # a local HF checkpoint (with its tokenizer), or "smollm2", instead of the tiny policy
    )
    device: str = "cpu"  # torch device of the policy
    seed: int = 0  # seed of the task build, the warm-up and the RL run
    escalate: bool = True  # ask the task factory for harder tasks when the pool goes easy
    task_set: Path | None = None  # use this existing task set instead of building one
    engine: str = "hf"  # rollout engine: hf (in-process) or vllm (a served engine cadenza starts and syncs)
    max_staleness: int = 0  # rollouts of the next K steps overlap this step's update (docs/async.md)

    def __post_init__(self) -> None:
        if (
            self.steps < 1
            or self.tasks_per_step < 1
            or self.group_size < 2
            or self.max_tasks < 1
            or self.max_turns < 1
            or self.max_new_tokens < 1
        ):
            raise CadenzaError(
                "demo needs --steps, --tasks-per-step, --max-tasks, --max-turns, --max-new-tokens >= 1 "
                "and --group-size >= 2"
            )
        from cadenza.rl.config import RolloutConfig, validate_engine

        validate_engine(
            RolloutConfig(engine=self.engine, max_staleness=self.max_staleness)  # type: ignore[arg-type]
        )


# ------------------------------------------------------------------ warm-up transcripts


def _workspace_files(task_dir: Path) -> list[str]:
    ws = task_dir / "workspace"
    return sorted(str(p.relative_to(ws)) for p in ws.rglob("*.py") if p.is_file())[:40]


def _call(name: str, args: dict[str, Any], i: int) -> dict[str, Any]:
    from cadenza.agent.env import ToolCall
    from cadenza.rl.text.chat import assistant_message

    return assistant_message("", [ToolCall(name=name, arguments=args, id=f"call_{i}")])


def transcript(rng: random.Random, task_dir: Path, task: Any) -> list[dict[str, Any]]:
    """One plausible episode in the agent's format: look around, run tests, submit (observations are
    short)."""
    from cadenza.agent.prompt import initial_messages
    from cadenza.agent.tools import TOOL_SCHEMAS

    files = _workspace_files(task_dir) or [task.feature.path]
    tests = [f for f in files if "test" in f] or files
    msgs = initial_messages(workspace=WORKSPACE, statement=task.statement, tools=TOOL_SCHEMAS)
    plan = [("view", {"path": task.feature.path})]
    plan += rng.sample(
        [
            ("view", {"path": rng.choice(files)}),
            ("run_tests", {"selector": rng.choice(tests)}),
            ("bash", {"command": "ls"}),
            ("run_tests", {}),
        ],
        k=rng.randint(0, 2),
    )
    plan.append(("submit", {}))
    for i, (name, args) in enumerate(plan):
        msgs.append(_call(name, args, i))
        if name == "submit":
            break
        obs = {
            "view": '1\t"""module"""\n2\t',
            "run_tests": "1 failed, 3 passed",
            "bash": "\n".join(files[:5]),
        }[name]
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "name": name, "content": obs})
    return msgs


def _plain(msg: dict[str, Any]) -> str:
    if msg.get("tool_calls"):
        fn = msg["tool_calls"][0]["function"]
        return f'<tool_call>\n{{"name": "{fn["name"]}", "arguments": {fn["arguments"]}}}\n</tool_call>'
    return f"{msg['role']}\n{msg['content']}"


def build_tiny_policy(task_dirs: list[Path], out: Path, cfg: DemoConfig, log: Any = print) -> Path:
    """Tokenizer trained here + tiny Qwen3 + SFT on call-format transcripts; saved as an HF directory
    (reused)."""
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        log(f"reusing the warm-started tiny policy in {out}")
        return out
    import torch

    from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config
    from cadenza.rl.learn.sft import SFTConfig, encode_messages, supervised_finetune
    from cadenza.rl.text.chat import train_tokenizer
    from cadenza.tasks.records.task import load_task

    if not task_dirs:
        raise CadenzaError("the demo task set has no tasks to write warm-up transcripts for")
    rng = random.Random(cfg.seed)
    tasks = [(d, load_task(d)) for d in task_dirs]
    transcripts = [transcript(rng, *rng.choice(tasks)) for _ in range(cfg.transcripts)]
    texts = [_plain(m) for t in transcripts for m in t] + ["system\n", "user\n", "assistant\n", "tool\n"] * 20
    tok = train_tokenizer(texts, vocab_size=cfg.vocab_size, extra_special_tokens=CALL_PIECES)
    torch.manual_seed(cfg.seed)
    # vLLM's CPU attention needs head_dim >= 32: the same width in 2 heads of 32 instead of 4 of 16
    heads = (
        {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32} if cfg.engine == "vllm" else {}
    )
    policy = HFPolicy.from_config(
        tiny_qwen3_config(len(tok), hidden_size=64, intermediate_size=128, **heads), seed=cfg.seed
    )
    # encoded as the rollouts see them: the system prompt lists the tools, the template does not repeat them
    data = [encode_messages(tok, t) for t in transcripts]
    losses = supervised_finetune(
        policy, tok, data, SFTConfig(steps=cfg.sft_steps, batch_size=4, lr=1e-2, warmup=5, seed=cfg.seed)
    )
    log(f"SFT warm-up on {len(data)} call-format transcripts: loss {losses[0]:.2f} -> {losses[-1]:.2f}")
    out.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


# ------------------------------------------------------------------ the run


def train_config(cfg: DemoConfig, task_set: Path, model_dir: Path) -> Any:
    from cadenza.rl.config import (
        EnvConfig,
        ModelConfig,
        OptimConfig,
        RolloutConfig,
        RunConfig,
        TrainConfig,
    )

    return TrainConfig(
        run=RunConfig(
            out_dir=str(cfg.out / "train"),
            steps=cfg.steps,
            seed=cfg.seed,
            checkpoint_every=1,
            measure_kl=False,
        ),
        model=ModelConfig(path=str(model_dir), device=cfg.device),
        env=EnvConfig(
            name="taskset",
            options={
                "task_set": str(task_set),
                "max_turns": cfg.max_turns,
                "time_budget_s": 120.0,
                "escalate": cfg.escalate,
                "seed": cfg.seed,
                "curriculum": {"escalate_min_groups": 2, "escalate_cooldown_steps": 2, "escalate_tasks": 2},
            },
        ),
        rollout=RolloutConfig(
            group_size=cfg.group_size,
            tasks_per_step=cfg.tasks_per_step,
            max_turns=cfg.max_turns,
            max_new_tokens=cfg.max_new_tokens,
            engine=cfg.engine,  # type: ignore[arg-type]
            max_staleness=cfg.max_staleness,
        ),
        optim=OptimConfig(lr=1e-3, microbatch=4),
    )


class DemoResult(NamedTuple):
    """What a demo run leaves behind: the task set, the warmed-up model, the run and its plot."""

    task_set: Path
    model_dir: Path
    run_dir: Path
    rows: list[dict[str, Any]]
    plot: Path


def prepare_tasks(cfg: DemoConfig, console: Any = None) -> Path:
    from cadenza.tasks.builder.demo import DEMO_SOURCE, build_demo_tasks

    if cfg.task_set is not None:
        return cfg.task_set
    out = cfg.out / "tasks"
    summary = build_demo_tasks(
        out,
        source=cfg.source or DEMO_SOURCE,
        max_tasks=cfg.max_tasks,
        levels=cfg.levels,
        seed=cfg.seed,
        console=console,
    )
    if not summary.tasks:
        raise CadenzaError(f"the task factory built no task from {cfg.source or DEMO_SOURCE}; see {out}")
    if console is not None:
        from cadenza.tasks.records.report import out_console, print_summary

        print_summary(summary, out_console())  # tasks per level, F2P/P2P, yield, time; wide when piped
    return out


def check_device(device: str) -> None:
    """Fail before any work when the requested device does not exist here."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise CadenzaError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CadenzaError(
            f"--device {device!r} needs a CUDA GPU, and torch sees none here; use --device cpu"
        )


def check_policy(cfg: DemoConfig) -> Path | None:
    """``--device`` and ``--model``, checked (and SmolLM2 converted) before any long work: the task build,
    the toolworld phase's warm-up. The model's directory, or None for the tiny policy trained here."""
    check_device(cfg.device)
    if not cfg.model:
        return None
    from cadenza.rl.models import resolve_model

    model_dir = Path(resolve_model(cfg.model)).expanduser().resolve()
    if not model_dir.is_dir():
        raise CadenzaError(
            f"--model {cfg.model!r} is not a directory; point it at a local HF checkpoint or use smollm2"
        )
    return model_dir


def run_demo(cfg: DemoConfig, console: Any = None, log: Any = print) -> DemoResult:
    """Tasks -> policy -> RL with curriculum -> metrics, checkpoints and a pass-rate PNG under ``cfg.out``."""
    from cadenza.rl.train.trainer import Trainer
    from cadenza.tasks.records.pool import TaskPool
    from cadenza.tasks.records.pool_report import plot_pass_rates
    from cadenza.tasks.records.store import TaskStore

    model_dir = check_policy(cfg)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the demo shows its own progress; shard bars are noise here
    task_set = prepare_tasks(cfg, console)
    if model_dir is None:
        model_dir = build_tiny_policy(TaskStore(task_set).task_dirs(), cfg.out / "policy", cfg, log)
    trainer = Trainer(train_config(cfg, task_set, model_dir))
    rows = trainer.train()
    source = trainer.source
    if getattr(source, "escalator", None) is not None:
        source.escalator.wait(timeout=600)  # let a background escalation land before the report
        source.escalator.drain()
    with TaskPool(task_set) as pool:
        plot = plot_pass_rates(pool, cfg.out / "pass_rates.png")
    return DemoResult(task_set=task_set, model_dir=model_dir, run_dir=Path(trainer.out), rows=rows, plot=plot)


def report_table(rows: list[dict[str, Any]]) -> Any:
    """One row per RL step: what the run learnt and what the pool looks like."""
    from rich.table import Table

    table = Table(title="cadenza demo: RL over the task pool")
    cols = [
        ("step", "step", "{}"),
        ("reward", "reward", "{:.2f}"),
        ("resolved", "resolved_rate", "{:.2f}"),
        ("invalid tool", "invalid_tool_rate", "{:.2f}"),
        ("hinted turns", "hinted_turns", "{}"),
        ("SD loss", "sd_loss", "{:.2e}"),
        ("0-var groups", "zero_variance_groups", "{}"),
        ("pool active", "pool_active", "{}"),
        ("mean pass", "pool_mean_pass", "{:.2f}"),
        ("escalation", "escalation_started", "{}"),
    ]
    for name, *_ in cols:
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(*[("-" if r.get(k) is None else fmt.format(r[k])) for _, k, fmt in cols])
    return table


def summary_json(result: DemoResult) -> str:
    return json.dumps(
        {
            "task_set": str(result.task_set),
            "model": str(result.model_dir),
            "run": str(result.run_dir),
            "metrics": str(result.run_dir / "metrics.jsonl"),
            "pass_rate_plot": str(result.plot),
        }
    )
