"""Run mini-swe-agent with an OpenAI-compatible model over a cadenza task set (in the ecosystem venv).

``cadenza miniswe TASKS_DIR --endpoint URL --model NAME`` starts this module with the ecosystem venv's
python (:mod:`cadenza.integrations.install`); it writes ``OUT/ID.traj.json`` (mini-swe-agent's format),
``OUT/ID.cadenza.json`` (cadenza's) and ``OUT/summary.json`` (one row per task: resolved, reward, flags).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cadenza.agent.episode import EpisodeConfig
from cadenza.agent.evaluate import discover_tasks
from cadenza.errors import CadenzaError
from cadenza.integrations.miniswe import builtin_config, openai_model, require_minisweagent, run_task
from cadenza.jsonio import atomic_write_json


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cadenza miniswe", description=__doc__.splitlines()[0])
    ap.add_argument("tasks_dir", type=Path, help="a task set (or one task directory)")
    ap.add_argument(
        "--endpoint", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1"
    )
    ap.add_argument("--model", required=True, help="model name the server knows")
    ap.add_argument("--api-key", default="none", help="API key sent to the server (default: none)")
    ap.add_argument("--config", default="mini.yaml", help="mini-swe-agent YAML config (path or builtin name)")
    ap.add_argument("--step-limit", type=int, default=30, help="model calls per task (0: no limit)")
    ap.add_argument("--out", type=Path, default=Path("runs/miniswe"), help="output directory")
    return ap


def run(args: argparse.Namespace) -> list[dict]:
    require_minisweagent()
    tasks = discover_tasks(args.tasks_dir)
    config = builtin_config(args.config)
    agent_config = {**config.get("agent", {}), "step_limit": args.step_limit}
    rows = []
    for task_dir in tasks:
        model = openai_model(args.model, args.endpoint, api_key=args.api_key, config=config.get("model"))
        episode = EpisodeConfig(max_turns=max(args.step_limit, 1) * 4 if args.step_limit else 1000)
        out = run_task(task_dir, model, agent_config=agent_config, out_dir=args.out, episode_config=episode)
        row = {k: out.get(k) for k in ("task_id", "resolved", "reward", "exit_status", "turns")}
        row["flags"] = sorted({f["rule"] for f in out.get("flags", [])})
        rows.append(row)
        print(json.dumps(row), flush=True)
    atomic_write_json(args.out / "summary.json", {"tasks": rows})
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        run(args)
    except CadenzaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
