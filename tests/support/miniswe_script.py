"""Run in the ecosystem venv: mini-swe-agent's own DeterministicModel replays scripted commands on a
cadenza task through :func:`cadenza.integrations.miniswe.run_task`; prints the outcome as JSON.

``python miniswe_script.py TASK_DIR OUT_DIR COMMANDS.json`` (a JSON list of shell commands; the last
one should be mini-swe-agent's submission command).
"""

import json
import sys
from pathlib import Path

from cadenza.integrations.miniswe import builtin_config, require_minisweagent, run_task

require_minisweagent()
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

task_dir, out_dir, commands = sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text())
outputs = [make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(commands)]
model = DeterministicModel(outputs=outputs)
agent_config = builtin_config("mini.yaml")["agent"]
print(json.dumps(run_task(task_dir, model, agent_config=agent_config, out_dir=out_dir)))
