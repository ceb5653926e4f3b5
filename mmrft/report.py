"""Run reports: PNG plots of a run's metrics (reward per verifier, evaluation, lengths, time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(h["step"], h[key]) for h in history if key in h]
    return [p[0] for p in points], [p[1] for p in points]


def _legend(ax: plt.Axes) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def write_report(run_dir: Path, history: list[dict[str, Any]], path: Path | None = None) -> Path:
    """Write ``report.png``: train reward (total and per verifier), eval metrics, completion
    length, and the time split of a step, each against the RL step."""
    path = path or run_dir / "report.png"
    keys = {k for h in history for k in h}
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    ax = axes[0][0]
    for key in sorted(k for k in keys if k.startswith("train/reward") and k.count("/") <= 2):
        steps, values = _series(history, key)
        ax.plot(
            steps, values, label=key.removeprefix("train/"), lw=1.8 if key == "train/reward" else 1
        )
    ax.set_title("train reward")
    ax.set_xlabel("step")
    _legend(ax)
    ax = axes[0][1]
    for key in sorted(k for k in keys if k.startswith("eval/") and not k.endswith("truncated")):
        steps, values = _series(history, key)
        ax.plot(steps, values, marker="o", label=key.removeprefix("eval/"))
    ax.set_title("evaluation (test split)")
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    _legend(ax)
    ax = axes[1][0]
    for key in ("rollout/len_mean", "train/entropy"):
        steps, values = _series(history, key)
        if steps:
            ax.plot(steps, values, label=key)
    ax.set_title("completion length (tokens) / entropy")
    ax.set_xlabel("step")
    _legend(ax)
    ax = axes[1][1]
    for key in ("time/rollout_s", "time/reward_s", "time/update_s"):
        steps, values = _series(history, key)
        if steps:
            ax.plot(steps, values, label=key)
    ax.set_title("time per step (s)")
    ax.set_xlabel("step")
    _legend(ax)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
