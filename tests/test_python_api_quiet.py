"""The Python API from a notebook: ``verbose=False`` keeps mmrft off stdout/stderr (train.log is
still written), and ``mmrft.train`` returns a summary with attributes as well as keys."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import NO_EVAL, short_run

import mmrft


def _config(tmp_path: Path, name: str, *extra: str):
    return mmrft.load_config("demo", [*short_run(tmp_path, name, steps=1), *extra])


def test_quiet_train_prints_nothing_and_returns_the_run(tmp_path, capfd, caplog):
    cfg = _config(tmp_path, "quiet", "eval.before=false", "data.max_test_samples=2")
    capfd.readouterr()
    with caplog.at_level(logging.INFO, logger="mmrft"):
        result = mmrft.train(cfg, verbose=False)
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out[-500:], err[-500:])
    assert any("step 1 done" in r.getMessage() for r in caplog.records)  # logging still gets it
    # backwards compatible: the summary dict, summary['run_dir'] as the README shows
    run_dir = tmp_path / "quiet"
    assert isinstance(result, dict)
    assert result["run_dir"] == str(run_dir)
    assert json.loads((run_dir / "summary.json").read_text()) == dict(result)
    assert "step 1 done" in (run_dir / "train.log").read_text()  # the log is written in full
    # and attributes for code
    assert result.run_dir == run_dir
    assert result.checkpoint == run_dir / "checkpoints" / "step-000001"
    assert result.checkpoint.is_dir()
    assert result.before is None  # eval.before=false
    assert result.after == result["after"] and 0.0 <= result.after <= 1.0
    assert set(result.evals) == {"after"}
    assert result.metrics["primary"] == result.after and "accuracy" in result.metrics

    # a finished run returns the same object from its files, still quietly
    again = mmrft.train(_config(tmp_path, "quiet", "eval.before=false"), verbose=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert dict(again) == dict(result) and again.checkpoint == result.checkpoint
    assert again.metrics == result.metrics


def test_verbose_is_the_default_and_prints_the_banner(tmp_path, capfd):
    result = mmrft.train(_config(tmp_path, "loud", *NO_EVAL))
    out, _ = capfd.readouterr()
    assert "mmrft train" in out and "summary:" in out
    assert result.metrics == {} and result.after is None
    assert result.checkpoint == tmp_path / "loud" / "checkpoints" / "step-000001"


def test_quiet_evaluate_config_prints_nothing(tmp_path, capfd):
    cfg = mmrft.load_config("demo", ["data.max_test_samples=2", "eval.max_new_tokens=4"])
    capfd.readouterr()
    result = mmrft.evaluate_config(cfg, verbose=False)
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out[-500:], err[-500:])
    assert len(result.records) == 2 and "accuracy" in result.metrics


@pytest.mark.parametrize("bad", ["no", 0, None, [True]])
def test_verbose_must_be_a_bool(tmp_path, bad):
    with pytest.raises(TypeError, match="mmrft.train: verbose: expected True or False"):
        mmrft.train(_config(tmp_path, "bad", *NO_EVAL), verbose=bad)
    with pytest.raises(TypeError, match="mmrft.evaluate_config: verbose"):
        mmrft.evaluate_config(mmrft.load_config("demo"), verbose=bad)
    assert not (tmp_path / "bad").exists()  # refused before anything is written


QUIET_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
from helpers import short_run
import mmrft
cfg = mmrft.load_config("demo", [*short_run({out!r}, "q", steps=1), "eval.before=false",
                                 "data.max_test_samples=2"])
result = mmrft.train(cfg, verbose=False)
test = mmrft.load_config("demo", ["data.max_test_samples=2", f"model.path={{result.checkpoint}}"])
evaluated = mmrft.evaluate_config(test, verbose=False)
open({told!r}, "w").write(f"{{result.checkpoint}} {{len(evaluated.records)}}")
"""


def test_quiet_in_a_fresh_process(tmp_path):
    """Outside pytest (no logging handler configured, as in a notebook's first cell): the
    libraries' progress bars ("Loading weights", "Writing model shards") and Python's
    last-resort log handler stay off stdout/stderr too."""
    told = tmp_path / "told.txt"
    script = QUIET_SCRIPT.format(
        tests=str(Path(__file__).parent), out=str(tmp_path), told=str(told)
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "" and done.stderr == "", (done.stdout[-500:], done.stderr[-500:])
    assert told.read_text() == f"{tmp_path / 'q' / 'checkpoints' / 'step-000001'} 2"
    assert "step 1 done" in (tmp_path / "q" / "train.log").read_text()
