"""Checkpoint files (mmrft/runtime/checkpoint.py): a kill at any moment of a save, or of the deletion of
an old checkpoint, never leaves a ``step-NNNNNN`` directory without its trainer state."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mmrft.runtime import checkpoint
from mmrft.runtime.checkpoint import STATE_FILE, list_checkpoints, save_checkpoint


def write_model(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"weights")


def test_a_kill_while_an_old_checkpoint_is_deleted_leaves_no_half_step(tmp_path, monkeypatch):
    for step in (1, 2):
        save_checkpoint(tmp_path, step, write_model, {"step": step}, keep_last=2)
    real = shutil.rmtree

    def killed_midway(path, *args, **kwargs):  # the state file goes first, then the kill
        (Path(path) / STATE_FILE).unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 3, write_model, {"step": 3}, keep_last=2)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real)
    steps = [p for p in tmp_path.iterdir() if checkpoint.STEP_DIR.match(p.name)]
    assert all((p / STATE_FILE).is_file() for p in steps), sorted(p.name for p in steps)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]
    save_checkpoint(tmp_path, 4, write_model, {"step": 4}, keep_last=2)  # cleans the leftover
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000003", "step-000004"]


def test_re_saving_a_step_replaces_it_whole(tmp_path):
    save_checkpoint(tmp_path, 5, write_model, {"step": 5, "v": 1}, keep_last=1)
    (tmp_path / "step-000005" / "stale.txt").write_text("from the first save")
    save_checkpoint(tmp_path, 5, write_model, {"step": 5, "v": 2}, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000005"]
    assert not (tmp_path / "step-000005" / "stale.txt").exists()
    assert checkpoint.load_trainer_state(tmp_path / "step-000005")["v"] == 2
