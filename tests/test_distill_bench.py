"""benchmarks/distill.py: when a run reaches the teacher's accuracy, the RL seconds to it (the
evaluations left out), and the table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def distill():
    sys.path.insert(0, str(REPO / "benchmarks"))  # it imports benchmarks/learning.py
    spec = importlib.util.spec_from_file_location("distill", REPO / "benchmarks" / "distill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


METRIC = "eval/classification/accuracy"
SUCCESS = "eval/prompt/tools/stop/env_done"


def fake_run(path: Path, accuracy: dict[int, float], metric: str = METRIC) -> Path:
    path.mkdir()
    lines = [{"step": s, "time/step_s": 0.5, "train/reward": 1.0} for s in range(1, 9)]
    lines += [{"step": s, metric: a, SUCCESS: a / 2} for s, a in accuracy.items()]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_the_first_step_at_the_goal_and_the_seconds_to_it(tmp_path: Path) -> None:
    bench = distill()
    run = fake_run(tmp_path / "a", {0: 0.25, 4: 0.6, 6: 0.96, 8: 0.99})
    row = bench.reached(run, 0.95, METRIC, None)
    assert (row["step"], row["seconds"], row["before"], row["after"]) == (6, 3.0, 0.25, 0.99)
    assert row["rl_seconds"] == 4.0
    never = bench.reached(fake_run(tmp_path / "b", {0: 0.25, 8: 0.5}), 0.95, METRIC, None)
    assert never["step"] is None and never["seconds"] is None
    rows = [
        {"seed": 0, "method": "grpo", "steps": 8, **never},
        {"seed": 0, "method": "distill", "steps": 8, **row},
    ]
    text = bench.table("demo", {"seed": 0, "after": 1.0}, rows, 0.95)
    assert "| 0 | grpo | 8 | 0.250 | 0.500 | – | never | never | 4.0 |" in text
    assert "| 0 | distill | 8 | 0.250 | 0.990 | – | 6 | 3.0 | 4.0 |" in text


def test_grid_walk_rows_carry_the_success_rate(tmp_path: Path) -> None:
    """On grid_walk the goal is on the episode reward, and each row also gives the share of
    episodes that reached the goal before and after RL."""
    bench = distill()
    metric = bench.TASKS["grid_walk"]["metric"]
    run = fake_run(tmp_path / "a", {0: 0.2, 4: 0.96}, metric)
    row = bench.reached(run, 0.95, metric, bench.TASKS["grid_walk"]["success"])
    assert (row["step"], row["success_before"], row["success_after"]) == (4, 0.1, 0.48)
    text = bench.table(
        "grid_walk",
        {"seed": 0, "after": 1.0},
        [{"seed": 0, "method": "grpo", "steps": 8, **row}],
        0.95,
    )
    assert "random moves: 0.163" in text
    assert "| 0 | grpo | 8 | 0.200 | 0.960 | 0.100 / 0.480 | 4 | 2.0 | 4.0 |" in text
