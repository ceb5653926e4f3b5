"""Optional experiment trackers beside ``metrics.jsonl``: TensorBoard and Weights & Biases.

Selected with ``train.trackers: [tensorboard, wandb]``. Both receive every metric line with
its step and, every ``train.completions_every`` steps, a table of sampled completions with
their images. W&B defaults to offline mode (``train.wandb_mode``), which needs no account:
``wandb sync RUN_DIR/wandb/offline-run-*`` uploads later. Install with ``pip install
mmrft[track]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TRACKERS = ("tensorboard", "wandb")


class TensorBoardTracker:
    """Scalars under their metric names; completions as a markdown text table."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_completions(self, step: int, rows: list[dict[str, Any]]) -> None:
        lines = ["| id | media | completion | reward |", "|---|---|---|---|"]
        for row in rows:
            text = str(row["completion"]).replace("|", "\\|").replace("\n", " ")
            lines.append(
                f"| {row['id']} | {', '.join(row['media'])} | {text} | {row['reward']:.3f} |"
            )
        self.writer.add_text("completions", "\n".join(lines), step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """``wandb.log`` per step; completions as a ``wandb.Table`` with the prompt images."""

    def __init__(
        self, run_dir: Path, name: str, config: dict[str, Any], project: str, mode: str
    ) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=project,
            name=name,
            dir=str(run_dir),
            config=config,
            mode=mode,
            reinit="finish_previous",
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_completions(self, step: int, rows: list[dict[str, Any]]) -> None:
        table = self.wandb.Table(columns=["id", "image", "completion", "reward", "reasons"])
        for row in rows:
            images = [
                m
                for m in row["media"]
                if Path(m).suffix.lower() in (".png", ".jpg", ".jpeg", ".webp")
            ]
            image = self.wandb.Image(images[0]) if images and Path(images[0]).is_file() else None
            table.add_data(
                row["id"], image, row["completion"], row["reward"], str(row.get("reasons", {}))
            )
        self.run.log({"completions": table}, step=step)

    def close(self) -> None:
        self.run.finish()


def build_trackers(
    names: list[str], run_dir: Path, run_name: str, config: dict[str, Any], project: str, mode: str
) -> list[Any]:
    trackers: list[Any] = []
    for name in names:
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir))
        elif name == "wandb":
            trackers.append(WandbTracker(run_dir, run_name, config, project, mode))
    return trackers
