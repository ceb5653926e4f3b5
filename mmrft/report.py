"""Run reports: PNG plots and a markdown summary of one run, or an overlay of several.

``mmrft report RUN_DIR`` writes ``report.png`` and ``report.md`` into the run directory;
``mmrft report RUN_A RUN_B ...`` also writes ``comparison.png`` and ``comparison.md`` (into
``--out``, default the current directory) with the runs overlaid. Everything is read from
``metrics.jsonl`` (and ``summary.json`` when present), so a report can be made of a run that
is still going or that stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# (title, metric-name predicate) for each panel, in order.
PANELS: list[tuple[str, Any]] = [
    (
        "train reward (total and per verifier)",
        lambda k: k.startswith("train/reward") and k.count("/") <= 2,
    ),
    ("evaluation (test split)", lambda k: k.startswith("eval/") and not k.endswith("truncated")),
    ("KL to reference", lambda k: k == "train/kl"),
    ("entropy (nats / token)", lambda k: k == "train/entropy"),
    ("completion length (tokens)", lambda k: k == "rollout/len_mean"),
    ("time per step (s)", lambda k: k in ("time/rollout_s", "time/reward_s", "time/update_s")),
]


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is it a run directory?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(h["step"], h[key]) for h in history if key in h]
    return [p[0] for p in points], [p[1] for p in points]


def _draw(runs: dict[str, list[dict[str, Any]]], path: Path, title: str) -> Path:
    keys = sorted({k for history in runs.values() for h in history for k in h})
    panels = [(t, [k for k in keys if pred(k)]) for t, pred in PANELS]
    panels = [(t, ks) for t, ks in panels if ks]
    cols = 2
    rows = max(1, (len(panels) + 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.6 * rows), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, (panel_title, panel_keys) in zip(axes.flat, panels):
        for r, (run_name, history) in enumerate(runs.items()):
            for key in panel_keys:
                steps, values = _series(history, key)
                if not steps:
                    continue
                label = key if len(runs) == 1 else f"{run_name}: {key}"
                marker = "o" if key.startswith("eval/") else None
                ax.plot(
                    steps, values, styles[r % len(styles)], marker=marker, lw=1.2, ms=3, label=label
                )
        ax.set_title(panel_title)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(run_dir: Path, history: list[dict[str, Any]], path: Path | None = None) -> Path:
    """``report.png`` of one run: reward per verifier, eval metrics, KL, entropy, lengths, time."""
    return _draw({run_dir.name: history}, path or run_dir / "report.png", run_dir.name)


def _final(history: list[dict[str, Any]]) -> dict[str, float]:
    """The last value of every metric."""
    out: dict[str, float] = {}
    for h in history:
        out.update({k: v for k, v in h.items() if k != "step"})
    return out


def summary_markdown(runs: dict[str, Path]) -> str:
    """A markdown table: one column per run, rows for the outcome and the last value of the
    main metrics, and the mean time split of a step."""
    histories = {name: read_history(path) for name, path in runs.items()}
    summaries = {
        name: json.loads((path / "summary.json").read_text())
        if (path / "summary.json").is_file()
        else {}
        for name, path in runs.items()
    }
    rows: list[tuple[str, list[str]]] = []

    def fmt(value: Any) -> str:
        return (
            f"{value:.4g}" if isinstance(value, float) else ("—" if value is None else str(value))
        )

    for key in ("metric", "chance", "before", "after", "steps", "train_seconds"):
        rows.append((key, [fmt(summaries[n].get(key)) for n in runs]))
    finals = {n: _final(h) for n, h in histories.items()}
    keys = sorted(
        {
            k
            for f in finals.values()
            for k in f
            if k.startswith(("train/reward", "eval/", "train/kl", "train/entropy", "rollout/"))
        }
    )
    for key in keys:
        rows.append((f"last {key}", [fmt(finals[n].get(key)) for n in runs]))
    for key in ("time/rollout_s", "time/reward_s", "time/update_s", "time/step_s"):
        means = []
        for history in histories.values():
            values = [h[key] for h in history if key in h]
            means.append(fmt(sum(values) / len(values)) if values else "—")
        rows.append((f"mean {key}", means))
    header = "| | " + " | ".join(runs) + " |\n|---|" + "---|" * len(runs) + "\n"
    return header + "".join(f"| {name} | " + " | ".join(values) + " |\n" for name, values in rows)


def report_runs(run_dirs: list[Path], out: Path | None = None) -> list[Path]:
    """Write each run's ``report.png`` / ``report.md`` and, for several runs, the comparison."""
    written = []
    for run_dir in run_dirs:
        written.append(write_report(run_dir, read_history(run_dir)))
        md = run_dir / "report.md"
        md.write_text(
            f"# {run_dir.name}\n\n![report](report.png)\n\n"
            + summary_markdown({run_dir.name: run_dir})
        )
        written.append(md)
    if len(run_dirs) > 1:
        out = out or Path.cwd()
        out.mkdir(parents=True, exist_ok=True)
        names = {}
        for run_dir in run_dirs:  # unique column names even for runs with the same folder name
            name = run_dir.name if run_dir.name not in names else str(run_dir)
            names[name] = run_dir
        written.append(
            _draw(
                {n: read_history(p) for n, p in names.items()},
                out / "comparison.png",
                " vs ".join(names),
            )
        )
        md = out / "comparison.md"
        md.write_text(
            "# "
            + " vs ".join(names)
            + "\n\n![comparison](comparison.png)\n\n"
            + summary_markdown(names)
        )
        written.append(md)
    return written
