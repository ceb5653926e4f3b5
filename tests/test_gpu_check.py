"""``benchmarks/gpu.py --cpu --tiny``: every stage of the GPU check runs on the CPU with the tiny
model, so the script a lent GPU runs cannot rot in between."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # make test-slow: 10-16 s of make test's ten minutes
def test_the_gpu_check_runs_every_stage_on_cpu(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu.py"),
            "--cpu",
            "--tiny",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert set(report["env"]["imports"].values()) == {"ok"}
    assert report["env"]["flex_attention"] is True
    assert report["tests"]["returncode"] == 0 and "passed" in report["tests"]["summary"]
    assert (tmp_path / "gpu_tests.log").is_file()
    steps = report["steps"]
    assert {r["group_shared"] for r in steps} == {True, False}
    for row in steps:
        assert "error" not in row, row
        assert row["rollout_s"] > 0 and row["update_s"] > 0 and row["completion_tokens_per_s"] > 0
        assert row["command"].startswith("mmrft train ") and row["parameters_lm"] > 0
    paths = {r["path"]: r for r in report["long_context"]}
    assert set(paths) == {"per_completion", "dense", "block_sparse"}
    assert all("error" not in r and r["seconds"] > 0 for r in paths.values()), paths
    table = (tmp_path / "gpu.md").read_text()
    assert "| tiny | group-shared |" in table and "| block_sparse |" in table
