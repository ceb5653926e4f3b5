"""A run killed with SIGKILL at random moments and restarted with resume=auto ends with the
same metrics, step for step, as a run never interrupted (deterministic CPU mode), and every
checkpoint left on disk after a kill loads whole."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]

OVERRIDES = [
    "warm_start.steps=5",
    "train.steps=8",
    "train.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=6",
    "eval.before=false",
    "eval.after=false",
    "checkpoint.every=1",
    "checkpoint.keep_last=2",
    "train.threads=1",
]


def run(tmp_path: Path, name: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mmrft.cli",
            "train",
            "demo",
            f"output_dir={tmp_path}",
            f"name={name}",
            *OVERRIDES,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def rewards(run_dir: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m["train/reward"] for m in lines if "train/reward" in m}


def last_step(run_dir: Path) -> int:
    """The highest step in metrics.jsonl so far, read while the run writes (0 before any; an
    unfinished last line is skipped)."""
    path, step = run_dir / "metrics.jsonl", 0
    if not path.exists():
        return 0
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            step = max(step, json.loads(line).get("step", 0))
    return step


def assert_checkpoints_load_whole(run_dir: Path) -> None:
    for checkpoint in (run_dir / "checkpoints").glob("step-*"):
        if ".tmp-" in checkpoint.name:
            continue  # an interrupted save: ignored and removed by the next save
        torch.load(checkpoint / "trainer_state.pt", weights_only=False)
        load_file(str(checkpoint / "model.safetensors"))


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_matches_uninterrupted(tmp_path):
    reference = run(tmp_path, "reference")
    assert reference.wait(timeout=300) == 0
    expected = rewards(tmp_path / "reference")
    assert sorted(expected) == list(range(1, 9))

    rng = random.Random(0)
    kills = 0
    for _attempt in range(12):
        seen = last_step(tmp_path / "killed")
        proc = run(tmp_path, "killed")
        # kill at a random moment after this attempt has trained past every step seen so far
        # (steps ~0.3 s, each followed by its checkpoint save), so every attempt makes progress
        # and kills land in steps and saves alike, whatever this machine's start-up time
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if last_step(tmp_path / "killed") > seen:
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            assert_checkpoints_load_whole(tmp_path / "killed")
            continue
        assert proc.returncode == 0
        break
    else:
        pytest.fail("the killed run never finished")
    assert kills >= 1, "no kill landed during training; adjust the timing"
    got = rewards(tmp_path / "killed")
    assert sorted(got) == sorted(expected)
    for step in expected:
        assert got[step] == pytest.approx(expected[step], abs=1e-6), step
    assert_checkpoints_load_whole(tmp_path / "killed")
