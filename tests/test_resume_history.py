"""A resumed run keeps its history: ``config.history.yaml`` (one entry per start and resume,
with the config changed against the run's previous one), a line per resume in ``train.log``,
and ``summary.json``'s times summed over the run's processes (kept in each checkpoint, so a
process killed after checkpoint N is never counted twice)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from helpers import NO_EVAL, short_run

from mmrft.config import load_config
from mmrft.runtime.checkpoint import STATE_FILE, load_trainer_state
from mmrft.training import resume as resume_mod
from mmrft.training import trainer as trainer_mod
from mmrft.training.trainer import train

REPO = Path(__file__).resolve().parents[1]


def _cfg(tmp_path: Path, *extra: str):
    overrides = [
        *short_run(tmp_path, "hist", steps=2),
        *NO_EVAL,
        "checkpoint.every=1",
        "checkpoint.keep_last=3",
    ]
    return load_config(REPO / "configs/demo.yaml", [*overrides, *extra])


def _history(run_dir: Path) -> list[dict]:
    return yaml.safe_load((run_dir / "config.history.yaml").read_text(encoding="utf-8"))


def test_force_resume_and_interrupted_resume_keep_history_and_summed_times(tmp_path, monkeypatch):
    run_dir = tmp_path / "hist"
    first = train(_cfg(tmp_path))
    assert first["processes"] == 1
    assert first["train_seconds"] == first["train_seconds_this_process"] > 0
    assert first["train_seconds_before_resume"] == 0.0
    [start] = _history(run_dir)
    assert start["event"] == "start" and start["from_step"] == 0 and start["world_size"] == 1
    assert start["changes"] == {} and start["mmrft_version"]

    # second process: other settings under resume=force, killed before step 4 (after the
    # checkpoint of step 3): nothing after that checkpoint may count
    lr = _cfg(tmp_path).optim.lr
    changed = ("train.steps=4", f"optim.lr={lr / 2}", "checkpoint.resume=force")
    real_collect = trainer_mod.collect

    def killed_at_step_4(run, step):
        if step == 4:
            raise RuntimeError("killed")
        return real_collect(run, step)

    monkeypatch.setattr(trainer_mod, "collect", killed_at_step_4)
    with pytest.raises(RuntimeError, match="killed"):
        train(_cfg(tmp_path, *changed))
    monkeypatch.setattr(trainer_mod, "collect", real_collect)
    times_3 = load_trainer_state(run_dir / "checkpoints" / "step-000003")["times"]
    times_2 = load_trainer_state(run_dir / "checkpoints" / "step-000002")["times"]
    assert times_2["processes"] == 1 and times_3["processes"] == 2
    assert times_3["train_seconds"] > times_2["train_seconds"] >= first["train_seconds"] - 0.05
    assert times_3["total_seconds"] > times_2["total_seconds"]

    # third process: the same settings again, resumed from step 3
    last = train(_cfg(tmp_path, *changed))
    history = _history(run_dir)
    assert [e["event"] for e in history] == ["start", "resume", "resume"]
    assert [e["from_step"] for e in history] == [0, 2, 3]
    assert history[1]["changes"]["optim.lr"] == {"from": lr, "to": lr / 2}
    assert history[1]["changes"]["train.steps"] == {"from": 2, "to": 4}
    assert history[1]["resume"] == "force"
    assert history[2]["changes"] == {}
    assert history[2]["checkpoint"].endswith("step-000003")
    log = (run_dir / "train.log").read_text(encoding="utf-8")
    assert f"optim.lr: {lr!r} → {lr / 2!r}" in log
    assert "resumed from step 3" in log and "previous config.yaml: no change" in log

    # the sum: the totals of checkpoint 3 (processes 1 and 2) plus this process, no more
    assert last["processes"] == 3
    assert last["train_seconds_before_resume"] == round(times_3["train_seconds"], 1)
    assert last["total_seconds_before_resume"] == round(times_3["total_seconds"], 1)
    assert last["train_seconds"] == pytest.approx(
        times_3["train_seconds"] + last["train_seconds_this_process"], abs=0.15
    )
    assert last["train_seconds"] >= first["train_seconds"]
    assert last["train_seconds"] >= last["train_seconds_this_process"]
    assert last["total_seconds"] >= first["total_seconds"] + last["total_seconds_this_process"]
    final = load_trainer_state(run_dir / "checkpoints" / "step-000004")["times"]
    assert final["processes"] == 3 and round(final["train_seconds"], 1) == last["train_seconds"]


def test_a_checkpoint_without_time_totals_resumes_and_says_the_times_are_unknown(tmp_path):
    run_dir = tmp_path / "hist"
    train(_cfg(tmp_path))
    state_file = run_dir / "checkpoints" / "step-000002" / STATE_FILE
    state = torch.load(state_file, map_location="cpu", weights_only=False)
    del state["times"]  # as mmrft wrote checkpoints before it kept totals
    torch.save(state, state_file)
    (run_dir / "config.yaml").write_text("- not\n- a mapping\n")  # and a hostile old config
    summary = train(_cfg(tmp_path, "train.steps=3", "checkpoint.resume=force"))
    for key in ("train_seconds", "total_seconds", "processes", "train_seconds_before_resume"):
        assert summary[key] is None, key
    # this process's own time is known (one tiny step can round to 0.0 s: no timing asserted)
    assert isinstance(summary["train_seconds_this_process"], float)
    assert summary["train_seconds_this_process"] >= 0
    assert "unknown" in summary["times_note"]
    # the next checkpoint does not make up a number either
    assert load_trainer_state(run_dir / "checkpoints" / "step-000003")["times"] is None
    entry = _history(run_dir)[-1]
    assert entry["event"] == "resume" and entry["changes"] is None
    assert "previous config.yaml is unreadable" in (run_dir / "train.log").read_text()


@pytest.mark.parametrize(
    "times",
    [
        None,
        "12",
        {},
        {"train_seconds": 1.0, "total_seconds": 2.0},
        {"train_seconds": -1.0, "total_seconds": 2.0, "processes": 1},
        {"train_seconds": math.nan, "total_seconds": 2.0, "processes": 1},
        {"train_seconds": math.inf, "total_seconds": 2.0, "processes": 1},
        {"train_seconds": "x", "total_seconds": 2.0, "processes": 1},
        {"train_seconds": 1.0, "total_seconds": 2.0, "processes": True},
        {"train_seconds": 1.0, "total_seconds": 2.0, "processes": 0},
        {"train_seconds": 1.0, "total_seconds": 2.0, "processes": 1.5},
    ],
)
def test_malformed_time_totals_count_as_unknown(times):
    assert resume_mod.saved_times({"times": times}) is None


def test_saved_time_totals_are_read_back():
    state = {"times": {"train_seconds": 3, "total_seconds": 5.5, "processes": 2}}
    assert resume_mod.saved_times(state) == {
        "train_seconds": 3.0,
        "total_seconds": 5.5,
        "processes": 2,
    }


@pytest.mark.parametrize(
    "previous",
    [None, "{{{ not yaml", "- a list\n- of things\n", "42\n", "model: [unclosed\n"],
)
def test_an_unreadable_previous_config_is_recorded_as_unknown_changes(tmp_path, previous):
    cfg = _cfg(tmp_path)
    checkpoint = tmp_path / "checkpoints" / "step-000002"
    line = resume_mod.record_start(cfg, tmp_path, previous, 1, checkpoint, 2)
    assert "changes unknown" in line
    [entry] = _history(tmp_path)
    assert entry["changes"] is None and entry["from_step"] == 2


def test_an_oversized_or_binary_previous_config_is_not_read(tmp_path):
    (tmp_path / "config.yaml").write_bytes(b"a: 1\n" * 300_000)
    assert resume_mod.previous_config(tmp_path) is None
    (tmp_path / "config.yaml").write_bytes(b"\xff\xfe\x00bad")
    assert resume_mod.previous_config(tmp_path) is None
    assert resume_mod.previous_config(tmp_path / "missing") is None


def test_a_new_start_begins_the_history_again(tmp_path):
    cfg = _cfg(tmp_path)
    (tmp_path / "config.history.yaml").write_text("- event: resume\n  from_step: 9\n")
    line = resume_mod.record_start(cfg, tmp_path, None, 2, None, 0)
    assert line.startswith("started at step 0")
    [entry] = _history(tmp_path)
    assert entry["event"] == "start" and entry["world_size"] == 2 and entry["changes"] == {}
