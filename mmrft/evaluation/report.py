"""Run reports: PNG plots and a markdown summary of one run, or an overlay of several.

The plot has labelled axes and readable names: the training reward (total and per verifier);
the evaluation of the task's metric over RL steps with the chance level, and the evaluation
before RL (after any warm start) and after RL marked with their values; the warm start's
supervised loss when the run had one (``warm_start.jsonl``); KL, entropy, completion length and
time per step. In a comparison each run has one colour in every panel and the metrics of a
panel are told apart by line style.

``mmrft report RUN_DIR`` writes ``report.png`` and ``report.md`` into the run directory;
``mmrft report RUN_A RUN_B ...`` also writes ``comparison.png`` and ``comparison.md`` (into
``--out``, default the current directory) with the runs overlaid. Everything is read from
``metrics.jsonl`` (and ``summary.json`` when present), so a report can be made of a run that
is still going or that stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

# (title, y-axis label, metric-name predicate) of each panel after the reward and evaluation
# panels, in order.
PANELS: list[tuple[str, str, Any]] = [
    (
        "lmms-eval benchmarks (eval.harness)",
        "metric",
        lambda k: k.startswith("harness/") and "_stderr" not in k,
    ),
    ("KL to the reference model", "KL (nats / token)", lambda k: k == "train/kl"),
    (
        "on-policy distillation",
        "nats / token; share",
        lambda k: k in ("distill/reverse_kl", "distill/teacher_agree"),
    ),
    ("policy entropy", "entropy (nats / token)", lambda k: k == "train/entropy"),
    ("completion length", "tokens (mean)", lambda k: k == "rollout/len_mean"),
    (
        "time per RL step",
        "seconds",
        lambda k: (
            k in ("time/rollout_s", "time/reward_s", "time/update_s", "time/teacher_forward_s")
        ),
    ),
    (
        "tool rollouts: turns",
        "model turns per trajectory",
        lambda k: (
            k == "rollout/tools/turns_mean"
            or (k.startswith("eval/") and k.endswith("/tools/turns_mean"))
        ),
    ),
    (
        "tool rollouts: calls",
        "share",
        lambda k: k.endswith(("tools/use_rate", "tools/call_success")),
    ),
]

# Readable names of the metrics the panels plot.
LABELS = {
    "train/reward": "total",
    "time/rollout_s": "rollout",
    "time/reward_s": "verifiers",
    "time/update_s": "update",
    "time/teacher_forward_s": "teacher",
    "distill/reverse_kl": "reverse KL to the teacher",
    "distill/teacher_agree": "tokens at the teacher's argmax",
    "format_fail": "format failures",
    "len_mean": "mean length",
    "turns_mean": "turns",
    "use_rate": "trajectories with a successful call",
    "call_success": "calls that succeeded",
}


@dataclass
class RunData:
    """What the report of one run reads: ``metrics.jsonl``, ``summary.json`` (metric, chance,
    before, after) and ``warm_start.jsonl``, each when present."""

    history: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    warm_start: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, run_dir: Path) -> RunData:
        summary = run_dir / "summary.json"
        warm = run_dir / "warm_start.jsonl"
        return cls(
            read_history(run_dir),
            json.loads(summary.read_text()) if summary.is_file() else {},
            [json.loads(x) for x in warm.read_text().splitlines() if x.strip()]
            if warm.is_file()
            else [],
        )


def describe_model(cfg: Any, family: str, task: str, device: Any) -> str:
    """``model PATH (family, dtype); task TASK; device DEVICE``: the part of a run's one-line
    description that training's ``run:`` banner and ``mmrft eval``'s ``eval:`` line share."""
    return f"model {cfg.model.path} ({family}, {cfg.model.dtype}); task {task}; device {device}"


def describe_tools(cfg: Any) -> str:
    """``; tools crop, ... (at most N turns)`` for a run with tools, else empty."""
    tools = cfg.rollout.tools
    if tools.environment:
        return f"; environment {tools.environment} (at most {tools.max_turns} turns)"
    if not tools.names:
        return ""
    return f"; tools {', '.join(tools.names)} (at most {tools.max_turns} turns)"


def describe_run(cfg: Any, family: str, device: Any, samples: int) -> str:
    """What ``mmrft eval`` runs, in one line like training's ``run:`` banner: model (family,
    dtype), task, device, the number of test samples and their file, any tools."""
    return (
        f"eval: {describe_model(cfg, family, cfg.task.name, device)}; "
        f"{samples} sample{'s' if samples != 1 else ''} of {cfg.data.test}{describe_tools(cfg)}"
    )


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is it a run directory?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(h["step"], h[key]) for h in history if key in h]
    return [p[0] for p in points], [p[1] for p in points]


def _label(key: str) -> str:
    if key.startswith("harness/"):  # several benchmarks share a metric name: task/metric
        return key.removeprefix("harness/")
    name = LABELS.get(key) or LABELS.get(key.rsplit("/", 1)[-1]) or key.rsplit("/", 1)[-1]
    return f"{name} (evaluation)" if key.startswith("eval/") and "/tools/" in key else name


class _Styles:
    """One colour per run when several runs are drawn (the metric then by line style), else
    one colour per metric."""

    def __init__(self, runs: list[str]) -> None:
        self.runs = runs
        self.colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def __call__(self, run: int, key_index: int) -> dict[str, Any]:
        if len(self.runs) == 1:
            return {"color": self.colours[key_index % len(self.colours)], "linestyle": "-"}
        styles = ["-", "--", ":", "-."]
        return {
            "color": self.colours[run % len(self.colours)],
            "linestyle": styles[key_index % len(styles)],
        }

    def label(self, run: int, key: str) -> str:
        """The series' legend label; with several runs only the first run's series are
        labelled (the legend names the series, the figure's legend the runs)."""
        return _label(key) if run == 0 else "_" + _label(key)

    def panel_handles(self, handles: list[Any]) -> list[Any]:
        """A panel's legend handles; with several runs a run's lines drawn in black (the line
        style is what tells the series apart), other lines (chance) as they are."""
        if len(self.runs) == 1:
            return handles
        first = self(0, 0)["color"]
        out = []
        for h in handles:
            if isinstance(h, Line2D) and h.get_color() == first:
                h = Line2D(
                    [],
                    [],
                    color="black",
                    linestyle=h.get_linestyle(),
                    lw=h.get_linewidth(),
                    marker=h.get_marker(),
                    markersize=h.get_markersize(),
                )
            out.append(h)
        return out


def _reward_panel(ax: Any, runs: dict[str, RunData], style: _Styles) -> None:
    for r, data in enumerate(runs.values()):
        keys = sorted({k for h in data.history for k in h if k.startswith("train/reward")})
        keys = [k for k in keys if k.count("/") <= 2]
        for i, key in enumerate(keys):
            steps, values = _series(data.history, key)
            width = 2.0 if key == "train/reward" else 1.1
            ax.plot(steps, values, lw=width, label=style.label(r, key), **style(r, i))
    ax.set_title("training reward (mean over the step's completions)")
    ax.set_ylabel("reward")


def _eval_panel(ax: Any, runs: dict[str, RunData], style: _Styles) -> None:
    """The task's metric on the test split over RL steps: the chance level, the evaluation
    before RL (after any warm start) and after RL marked and written out."""
    metric = next((d.summary.get("metric") for d in runs.values() if d.summary.get("metric")), None)
    chance = next(
        (d.summary.get("chance") for d in runs.values() if d.summary.get("chance") is not None),
        None,
    )
    for r, data in enumerate(runs.values()):
        keys = sorted({k for h in data.history for k in h if k.startswith("eval/")})
        # the task's metrics; the tool loop's (turns, calls) have panels of their own
        keys = [k for k in keys if not k.endswith("/truncated") and "/tools/" not in k]
        keys.sort(key=lambda k: (k != metric, k))  # the task's metric first
        for i, key in enumerate(keys):
            steps, values = _series(data.history, key)
            main_metric = key == metric or metric is None
            ax.plot(
                steps,
                values,
                marker="o",
                ms=4 if main_metric else 2,
                lw=1.8 if main_metric else 0.9,
                alpha=1.0 if main_metric else 0.6,
                label=style.label(r, key),
                **style(r, i),
            )
        last = max((h["step"] for h in data.history), default=0)
        colour = style(r, 0)["color"]
        for name, step, value in (
            ("before RL", 0, data.summary.get("before")),
            ("after RL", last, data.summary.get("after")),
        ):
            if value is None:
                continue
            ax.scatter([step], [value], s=90, marker="D", color=colour, zorder=5, edgecolor="black")
            if len(runs) == 1:  # several runs: the values are in the figure's run legend
                ax.annotate(
                    f"{name} {value:.3f}",
                    (step, value),
                    textcoords="offset points",
                    xytext=(8, -16) if name == "before RL" else (-8, -18),
                    ha="left" if name == "before RL" else "right",
                    fontsize=9,
                )
    if chance is not None:
        ax.axhline(chance, color="gray", linestyle="--", lw=1, label=f"chance ({chance:.3g})")
    ax.set_title("evaluation on the test split")
    ax.set_ylabel(_label(metric) if metric else "metric")


def _warm_start_panel(ax: Any, runs: dict[str, RunData], style: _Styles) -> None:
    for r, data in enumerate(runs.values()):
        steps = [w["step"] for w in data.warm_start]
        ax.plot(
            steps, [w["loss"] for w in data.warm_start], label=style.label(r, "loss"), **style(r, 0)
        )
    ax.set_title("warm start (supervised, before RL)")
    ax.set_xlabel("warm-start step")
    ax.set_ylabel("cross-entropy (nats / token)")


def _draw(runs: dict[str, RunData], path: Path, title: str) -> Path:
    fig = figure(runs, title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def figure(runs: dict[str, RunData], title: str) -> Any:
    """The report's matplotlib figure of one run or several (one colour per run)."""
    style = _Styles(list(runs))
    keys = sorted({k for data in runs.values() for h in data.history for k in h})
    drawers: list[tuple[Any, Any]] = []
    if any(k.startswith("train/reward") for k in keys):
        drawers.append((_reward_panel, None))
    if any(k.startswith("eval/") for k in keys) or any(
        d.summary.get("after") is not None for d in runs.values()
    ):
        drawers.append((_eval_panel, None))
    if any(d.warm_start for d in runs.values()):
        drawers.append((_warm_start_panel, None))
    for panel in PANELS:
        if any(panel[2](k) for k in keys):
            drawers.append((None, panel))
    cols = 2
    rows = max(1, (len(drawers) + 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12, 4.0 * rows), squeeze=False)
    for ax, (draw, panel) in zip(axes.flat, drawers):
        if draw is not None:
            draw(ax, runs, style)
        else:
            panel_title, ylabel, predicate = panel
            for r, data in enumerate(runs.values()):
                panel_keys = sorted({k for h in data.history for k in h if predicate(k)})
                for i, key in enumerate(panel_keys):
                    steps, values = _series(data.history, key)
                    ax.plot(steps, values, lw=1.2, label=style.label(r, key), **style(r, i))
            ax.set_title(panel_title)
            ax.set_ylabel(ylabel)
        if not ax.get_xlabel():
            ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles=style.panel_handles(handles), labels=labels, fontsize=9)
    for ax in list(axes.flat)[len(drawers) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=13)
    if len(runs) == 1:
        fig.tight_layout()
        return fig
    # several runs: colour names the run (one legend for the figure, with before → after),
    # line style the series (each panel's legend, drawn in black)
    run_labels = []
    for name, data in runs.items():
        before, after = data.summary.get("before"), data.summary.get("after")
        change = (
            f" ({before:.3f} → {after:.3f})" if before is not None and after is not None else ""
        )
        run_labels.append(name + change)
    fig.legend(
        handles=[Line2D([], [], lw=2.5, **style(r, 0)) for r in range(len(runs))],
        labels=run_labels,
        loc="upper center",
        ncol=min(len(runs), 3),
        bbox_to_anchor=(0.5, 1 - 0.45 / fig.get_figheight()),  # below the title
        fontsize=10,
        frameon=False,
    )
    top = 1 - (0.55 + 0.25 * ((len(runs) + 2) // 3)) / fig.get_figheight()
    fig.tight_layout(rect=(0, 0, 1, top))
    return fig


def write_report(
    run_dir: Path, history: list[dict[str, Any]] | None = None, path: Path | None = None
) -> Path:
    """``report.png`` of one run: reward per verifier, the evaluation with chance and
    before/after, the warm start, KL, entropy, lengths, time."""
    data = RunData.read(run_dir)
    if history is not None:
        data.history = history
    return _draw({run_dir.name: data}, path or run_dir / "report.png", run_dir.name)


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
            if k.startswith(
                (
                    "train/reward",
                    "eval/",
                    "harness/",
                    "train/kl",
                    "train/entropy",
                    "rollout/",
                    "distill/",
                )
            )
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
    """The report of one run (``report.png`` / ``report.md``) or the comparison of several
    (``comparison.png`` / ``comparison.md``, in ``out``, default the current directory).

    Without ``out`` every run also gets its own report in its folder; with ``out`` nothing is
    written anywhere else (one run's report goes into ``out`` too)."""
    written = []
    for run_dir in run_dirs if out is None or len(run_dirs) == 1 else []:
        folder = out or run_dir
        folder.mkdir(parents=True, exist_ok=True)
        written.append(write_report(run_dir, read_history(run_dir), folder / "report.png"))
        md = folder / "report.md"
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
                {n: RunData.read(p) for n, p in names.items()},
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
