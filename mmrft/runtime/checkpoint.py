"""Checkpoints: written atomically, kept to the newest N, found again for ``resume=auto``.

Layout of a run directory's checkpoints::

    checkpoints/step-000100/   model (save_pretrained safetensors) + processor files
                               trainer_state.pt (optimizer, scheduler, RNGs, data position,
                               ``times``: the run's wall-clock totals up to this checkpoint)
    checkpoints/final -> the last step's directory name, in the file ``checkpoints/latest``

A checkpoint is written into ``step-NNNNNN.tmp-<pid>``, every file fsynced, then renamed to
``step-NNNNNN``: a rename is atomic, so a directory without ``.tmp`` is always complete, and
a kill during a save leaves only a ``.tmp`` directory that the next save removes. Old
checkpoints are renamed to such a name before they are deleted, for the same reason.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step-(\d{6,})$")
STATE_FILE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    checkpoints_dir: Path,
    step: int,
    write_model: Callable[[Path], None],
    trainer_state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write ``step-NNNNNN`` atomically, then delete older step checkpoints beyond ``keep_last``."""
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    for stale in checkpoints_dir.glob("step-*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)

    def write(tmp: Path) -> None:
        write_model(tmp)
        torch.save(trainer_state, tmp / STATE_FILE)

    # re-saving the same step (e.g. after a resume) replaces it whole
    final = replace_dir(checkpoints_dir / f"step-{step:06d}", write)
    for old in list_checkpoints(checkpoints_dir)[:-keep_last]:
        shutil.rmtree(_set_aside(old), ignore_errors=True)
    return final


def replace_dir(final: Path, write: Callable[[Path], None]) -> Path:
    """``final`` written by ``write(tmp)`` into ``<final>.tmp-<pid>``, every file fsynced, then
    renamed to ``final``; an existing ``final`` is set aside first and deleted after. A kill at
    any point leaves the old directory or the new one, whole (or a ``.tmp-`` one beside)."""
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    if tmp.exists():  # an earlier attempt of this process that failed midway
        shutil.rmtree(tmp)
    tmp.mkdir()
    write(tmp)
    _fsync_tree(tmp)
    replaced = _set_aside(final) if final.exists() else None
    os.replace(tmp, final)
    _fsync_tree(final.parent)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    return final


def _set_aside(checkpoint: Path) -> Path:
    """Rename ``checkpoint`` to a ``.tmp-`` name before deleting it, so that a kill during the
    deletion leaves a directory the next save removes, never a ``step-NNNNNN`` without its
    trainer state."""
    aside = checkpoint.with_name(f"{checkpoint.name}.tmp-old-{os.getpid()}")
    os.replace(checkpoint, aside)
    return aside


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Complete step checkpoints, oldest first."""
    if not checkpoints_dir.is_dir():
        return []
    found = [
        p
        for p in checkpoints_dir.iterdir()
        if p.is_dir() and STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()
    ]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))  # type: ignore[union-attr]


def find_resume_checkpoint(run_dir: Path, resume: str) -> Path | None:
    """``resume``: 'auto' (newest complete checkpoint of the run, or None), 'force' (the same,
    also when the config changed), 'never', or a path."""
    if resume == "never":
        return None
    if resume in ("auto", "force"):
        found = list_checkpoints(run_dir / "checkpoints")
        return found[-1] if found else None
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(
            f"checkpoint.resume: {path} is not a complete checkpoint (no {STATE_FILE})"
        )
    return path


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=False)


def checkpoint_step(checkpoint: Path) -> int | None:
    """The step of a ``step-NNNNNN`` checkpoint directory (``None`` for another name)."""
    found = STEP_DIR.match(checkpoint.name)
    return int(found.group(1)) if found else None


def write_failure_record(run_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write ``run_dir/failure.json`` (what stopped the run: ``step``, ``reason``, ``samples``,
    …) atomically, log it as an error, and return its path; checkpoints are left as they are."""
    path = Path(run_dir) / "failure.json"
    tmp = path.with_name(f".failure.json.{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    log.error("run stopped at step %s: %s", record.get("step"), record.get("reason"))
    return path


def write_step_failure(
    run_dir: str | Path, step: int, reason: str, sample_ids: Iterable[str], **more: Any
) -> Path:
    """:func:`write_failure_record` of a step that failed: ``step``, ``reason``, the ``samples``
    (ids, sorted, each once) and any ``more`` fields (``bad_media``: the media that failed)."""
    record = {"step": step, "reason": reason, "samples": sorted(set(sample_ids)), **more}
    return write_failure_record(run_dir, record)
